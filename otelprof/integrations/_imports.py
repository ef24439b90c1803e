"""Run a function right after a module's own code has run, whenever it is imported.

A finder first on ``sys.meta_path`` asks the finders after it for the module's spec and wraps
its loader's ``exec_module``; a module imported already is handled at once. Removing a hook
removes its finder (a module imported meanwhile keeps what the function did to it; undoing that
is the function's owner's job).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_log = logging.getLogger(__name__)


class PostImportHook:
    """``on_import(module)`` once for each of ``names`` (exact module names) when it is imported."""

    def __init__(self, names: Sequence[str], on_import: Callable[[ModuleType], None]) -> None:
        self._names = frozenset(names)
        self._on_import = on_import
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            self._installed = True
            sys.meta_path.insert(0, self)
        for name in self._names:
            module = sys.modules.get(name)
            if module is not None and not _initializing(module):
                self._fire(name, module)

    def remove(self) -> None:
        self._installed = False
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self._names or not self._installed:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)  # the module's own errors are the program's
            if self._installed:
                self._fire(fullname, module)

        loader.exec_module = exec_then_hook  # type: ignore[union-attr]
        return spec

    def _fire(self, name: str, module: ModuleType) -> None:
        with self._lock:
            if name in self._seen:
                return
            self._seen.add(name)
        try:
            self._on_import(module)
        except Exception:  # never into the program's import
            _log.warning("otelprof could not hook into %s", name, exc_info=True)


def _initializing(module: ModuleType) -> bool:
    """A module still running its own code (its import is under way on some thread)."""
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))
