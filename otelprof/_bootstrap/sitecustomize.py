"""Put on PYTHONPATH by ``otelprof run``: instruments the Python process it starts once that
process imports torch, then hands over to any ``sitecustomize`` this one shadows.

Lazy: a process that never imports torch (a launcher, a helper script, a tool) pays for this
file alone (standard library only, nothing of otelprof imported). A finder first on
``sys.meta_path`` waits for ``torch``; once torch's own module code has run, the thread that
imported it imports ``otelprof.auto``, still inside torch's import: the import system holds
every other thread that imports torch meanwhile until that is done, so otelprof's hooks are
in before any thread uses torch. The hook runs once whatever happens.

multiprocessing's spawned children (DataLoader workers with ``spawn``) inherit PYTHONPATH but
are not training loops: they are left alone.
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False  # typing's, without importing typing (this file runs in every process)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))
_TARGET = "torch"


def _chain() -> None:
    """Imports the next ``sitecustomize`` on the path, the one ours hides."""
    ours = sys.modules.pop("sitecustomize")
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    try:
        __import__("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        # the import of ours is still under way: importlib takes the name back out of
        # sys.modules when it finishes, and reports an error if it is gone
        sys.modules.setdefault("sitecustomize", ours)


def _instrument() -> None:
    try:
        import otelprof.auto  # noqa: F401
    except Exception as exc:  # never stop the job
        sys.stderr.write(f"otelprof: not instrumenting: {exc}\n")


class _TorchFinder:
    """Finds nothing itself: for ``torch`` it asks the finders after it and wraps the loader
    so that the instrumentation runs right after torch's module code."""

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()  # threading would cost its imports (~3 ms)
        self._done = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != _TARGET or self._done:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)  # a legacy finder may have none
            if finder is not self and find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        loader = spec.loader if spec is not None else None
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_instrument(module: ModuleType) -> None:
            exec_module(module)  # torch's own import; its errors are the program's
            self._fire()

        loader.exec_module = exec_then_instrument  # type: ignore[union-attr]
        return spec

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self.remove()
        _instrument()

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _install() -> None:
    if "--multiprocessing-fork" in getattr(sys, "orig_argv", sys.argv):
        return
    if _TARGET in sys.modules:  # imported before site ran (embedders): instrument now
        _instrument()
        return
    sys.meta_path.insert(0, _TorchFinder())


_chain()
_install()
