"""Keeping the step hooks out of torch.compile's way (dynamo, torch >= 2.4).

Dynamo traces every Python frame it meets inside a compiled region, hooks included, and guards
the graphs it builds on the module hooks it saw. So, once ``torch._dynamo`` is imported (never
by otelprof: it costs seconds):

- the tracker's hooks (C functions, or the Python tracker's closures) are in dynamo's
  ``ignore_logging_functions``: traced inside a compiled region they are no-ops, with no graph
  break and no warning (what runs inside a graph cannot be timed without breaking it). Each is
  a well-formed function there: inductor writes every one as ``module.name`` into the repro
  script it makes at each compile that misses its cache (``codegen_config``), which fails on a C
  function with no ``__module__``. So the native hooks are named after this module, where
  those names are stand-ins, no-ops as the hooks are in compiled code: the repro script imports
  and runs. The set is set again after each change, so the config's derived copies follow;
- the Python frames otelprof adds (the backward and DataLoader wrappers, the discovery hooks)
  are frames dynamo skips when they run eagerly under a compiled function (after a graph break):
  no frame compiled, no graph break, while the frames they call are treated as before;
- ``on_compile()`` runs when dynamo starts compiling a frame, before it reads any hook: the
  forward hooks end root discovery there, so no graph is built, or guarded, with otelprof's
  global module hooks in it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .step import HOOKS

_log = logging.getLogger(__name__)
_DYNAMO = "torch._dynamo"
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType)


def _stand_in(name: str) -> Callable[..., None]:
    def hook(*_args: Any, **_kwargs: Any) -> None:
        """An otelprof hook in a script torch wrote (a repro): nothing, as in compiled code."""

    hook.__name__ = hook.__qualname__ = name
    return hook


# the names torch writes for the native hooks (otelprof.capture.steps.dynamo.begin_forward...,
# see _well_formed) resolve here when its script runs: module globals (a module __getattr__
# would hide a misspelt import from this module from mypy)
globals().update({name: _stand_in(name) for name in HOOKS})


def _well_formed(hook: Any) -> bool:
    """Whether ``hook`` has the ``__module__`` and ``__name__`` (strings) torch's config code
    reads from a function in ``ignore_logging_functions``; a C function made with no module
    (the native hooks) is given this module's name first. Its eager calls are not touched:
    the same C function, called by torch with no Python frame between."""
    if not isinstance(getattr(hook, "__module__", None), str):
        try:
            hook.__module__ = __name__
        except (AttributeError, TypeError):  # pragma: no cover - builtin functions allow it
            return False
    return isinstance(getattr(hook, "__name__", None), str)


class DynamoHooks:
    """Set up at once when dynamo is already imported, else when it is (an import hook)."""

    def __init__(self, hooks: Iterable[Any], frames: Iterable[Any], on_compile: Callable[[], None]) -> None:
        # functions only: dynamo deep-copies its config when it logs a compile, and a bound
        # method would take its object (a tracker, with its lock) along
        self._hooks = [h for h in hooks if isinstance(h, _FUNCTIONS)]
        self._codes = [c for c in (getattr(f, "__code__", None) for f in frames) if isinstance(c, types.CodeType)]
        self._on_compile = on_compile
        self._lock = threading.Lock()
        self._ignored: list[Any] = []
        self._callback: Callable[[Any], None] | None = None
        self._reset: tuple[Any, Any] | None = None  # (original, ours): torch._dynamo.reset
        self._finder: _AfterImport | None = None
        self._removed = False
        self.active = False  # set up in dynamo

    def install(self) -> None:
        if _DYNAMO in sys.modules:
            self._setup()
        else:
            self._finder = _AfterImport(_DYNAMO, self._setup)
            sys.meta_path.insert(0, self._finder)

    def remove(self) -> None:
        with self._lock:
            self._removed = True
            if self._finder is not None:
                self._finder.drop()
                self._finder = None
            if not self.active:
                return
            self.active = False
            config, handler = _dynamo_parts()
            ignored = getattr(config, "ignore_logging_functions", None)
            if isinstance(ignored, set) and self._ignored:
                ignored.difference_update(self._ignored)
                _changed(config, ignored)
            self._ignored = []
            if self._callback is not None and handler is not None:
                with contextlib.suppress(ValueError):  # cleared by someone else
                    handler.remove_start_callback(self._callback)
            self._callback = None
            if self._reset is not None:
                import torch._dynamo as dynamo

                original, ours = self._reset
                if dynamo.reset is ours:  # someone wrapped it after us: leave theirs
                    dynamo.reset = original
                self._reset = None

    def _setup(self) -> None:
        with self._lock:
            if self._removed or self.active:
                return
            self.active = True  # remove() undoes what a failing setup did
            try:
                self._setup_locked()
            except Exception:  # another dynamo: compiled code may break at otelprof's hooks
                _log.warning(
                    "otelprof could not keep its hooks out of torch.compile's way; compiled code may "
                    "recompile or break its graph at them",
                    exc_info=True,
                )

    def _setup_locked(self) -> None:
        import torch._dynamo as dynamo

        config, handler = _dynamo_parts()
        ignored = getattr(config, "ignore_logging_functions", None)
        if isinstance(ignored, set):
            for hook in self._hooks:
                # one that is not well formed would fail every inductor compile: without it the
                # compiled code breaks its graph at that hook instead
                if hook not in ignored and _well_formed(hook):
                    ignored.add(hook)
                    self._ignored.append(hook)
            if self._ignored:
                _changed(config, ignored)
        if handler is not None:
            on_compile = self._on_compile

            def started(_args: Any) -> None:
                try:
                    on_compile()
                except Exception:  # never into the compiler
                    _log.debug("otelprof: on_compile failed", exc_info=True)

            # a compile can start under a compiled function (a lazy backward): our frames stay
            # out of sight there too
            self._callback = dynamo.disable(started)  # type: ignore[no-untyped-call]  # unannotated in torch
        self._attach()
        # torch._dynamo.reset() forgets the compile callbacks and the frames to skip
        original = dynamo.reset
        attach = self._attach
        lock = self._lock

        @functools.wraps(original)
        def reset() -> None:
            original()
            with lock:
                if self.active:
                    attach()

        dynamo.reset = reset
        self._reset = (original, reset)

    def _attach(self) -> None:
        from torch._dynamo.eval_frame import skip_code

        for code in self._codes:
            skip_code(code)
        _, handler = _dynamo_parts()
        if self._callback is not None and handler is not None and self._callback not in handler.start_callbacks:
            handler.register_start_callback(self._callback)


def _changed(config: Any, ignored: set[Any]) -> None:
    """The set changed in place: set again, so torch's config forgets what it derived from the
    old value (the config's hash, the copies its repro scripts and saved configs are made from)."""
    config.ignore_logging_functions = ignored


def _dynamo_parts() -> tuple[Any, Any]:
    """(torch._dynamo.config, the compile callback handler or None)."""
    from torch._dynamo import config

    try:
        from torch._dynamo import callback
    except ImportError:  # pragma: no cover - torch < 2.4
        return config, None
    return config, getattr(callback, "callback_handler", None)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then()`` once module ``name`` has been imported (a post-import hook)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self._name = name
        self._then = then
        self._busy = False

    def drop(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name or self._busy:
            return None
        self._busy = True  # the search below must not find this finder again
        spec: importlib.machinery.ModuleSpec | None = None
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None and (spec := find(fullname, path, target)) is not None:
                    break
        finally:
            self._busy = False
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        self.drop()
        then = self._then
        original = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            original(module)
            then()

        spec.loader = _Loader(loader, exec_module)
        return spec


class _Loader(importlib.abc.Loader):
    """The module's own loader, with ``exec_module`` running the import hook after it."""

    def __init__(self, loader: Any, exec_module: Callable[[types.ModuleType], None]) -> None:
        self._loader = loader
        self._exec = exec_module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        self._exec(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, get_code ...
        return getattr(self._loader, name)
