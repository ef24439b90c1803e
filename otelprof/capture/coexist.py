"""The process's other profilers: otelprof's windows give way to them.

torch has one Kineto session per process. A window that runs beside the user's profiler shares
it, and whichever stops first ends it for both (lost events, "Profiler is already enabled",
crashes at exit). So otelprof watches the entry points through which anything else starts
profiling, and its windows never overlap one:

- before a window starts, ``active()`` says whether another profiler is on (or about to be): a
  ``torch.profiler.profile`` whose step range is open or whose Kineto session is prepared, the
  autograd profiler, ``emit_nvtx``/``emit_itt``, a running ``ExecutionTraceObserver``, CUDA
  memory-history recording, or Kineto's daemon (``KINETO_USE_DAEMON``: on-demand tracing may
  start at any time);
- when the user creates or prepares a profiler (``torch.profiler.profile()``, the autograd
  profiler's prepare, ``_run_on_profiler_start`` for ``emit_nvtx``/``emit_itt``, registering an
  execution-trace observer, enabling memory history) the listeners are told first, so a window
  in progress stops before the user's profiler starts.

The wrappers run before the user's profiler is enabled and return before it records anything,
so no frame of otelprof's is on the stack when a ``with_stack`` profile starts. otelprof's own
calls pass through them inside ``own()``.

A ``with_stack`` profile records every Python thread of the process (torch's Python tracer walks
all of them when it starts). So otelprof's own threads (exporter, step spans, /metrics, window
conversion), registered with ``quiet()``, stop when such a profiler is prepared and start again
at the first step boundary after it stopped (``resume_if_clear()``): their queues are kept, and
/metrics answers again then. A thread busy sending at that moment is waited for a short while
(``PAUSE_WAIT_S``), never longer.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

_log = logging.getLogger(__name__)

#: A listener is told, before another profiler starts, what it is.
Listener = Callable[[str], None]

_lock = threading.Lock()
_local = threading.local()  # .own: otelprof's own profiler calls on this thread
_listeners: list[Listener] = []
_originals: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, wrapper)
_outer: weakref.WeakSet[Any] = weakref.WeakSet()  # the user's torch.profiler.profile objects
_inner: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # prepared: results then
_observers: weakref.WeakSet[Any] = weakref.WeakSet()  # execution-trace observers
_memory_history = False
_daemon = False  # KINETO_USE_DAEMON, as torch read it at its import
_unseen = False  # a torch.profiler.profile existed before the wrappers (until torch forgets it)
#: Starts of other profilers seen so far: a step during which it moved was slowed by one.
starts = 0
#: How long each of otelprof's threads is waited for when a Python-tracing profiler starts.
PAUSE_WAIT_S = 0.2
_quiet: list[tuple[Callable[[float], None], Callable[[], None]]] = []  # (pause, resume)
_tracing: weakref.WeakSet[Any] = weakref.WeakSet()  # the user's with_stack profiles that paused them
paused = False  # otelprof's threads are stopped while a user's with_stack profile runs


@contextlib.contextmanager
def own() -> Iterator[None]:
    """otelprof's own profiler calls: the wrappers let them through unseen."""
    _local.own = True
    try:
        yield
    finally:
        _local.own = False


def _ours() -> bool:
    return bool(getattr(_local, "own", False))


def watch(listener: Listener) -> None:
    """Wraps torch's entry points (once per process) and tells ``listener`` of every start."""
    global _daemon, _unseen
    with _lock:
        if not _originals:
            _daemon = bool(os.environ.get("KINETO_USE_DAEMON"))
            _unseen = _unseen_profile()
            _import_lazy_modules()
            _install()
        if listener not in _listeners:
            _listeners.append(listener)


def unwatch(listener: Listener) -> None:
    """Removes ``listener``; the last one out puts torch's functions back (unless something
    wrapped them after otelprof, whose wrapper then keeps calling ours: it only passes through)."""
    with _lock:
        with contextlib.suppress(ValueError):
            _listeners.remove(listener)
        if _listeners:
            return
        for owner, name, original, wrapper in reversed(_originals):
            if owner.__dict__.get(name) is wrapper:
                setattr(owner, name, original)
        _originals.clear()


def quiet(pause: Callable[[float], None], resume: Callable[[], None]) -> Callable[[], None]:
    """Registers one of otelprof's threads: ``pause(wait_s)`` stops it (keeping its work),
    ``resume()`` starts it again. Returns the function that unregisters it (and resumes it,
    for a final flush)."""
    entry = (pause, resume)
    with _lock:
        _quiet.append(entry)
        if paused:
            pause(PAUSE_WAIT_S)

    def remove() -> None:
        global paused
        with _lock:
            if entry not in _quiet:
                return
            _quiet.remove(entry)
            if not _quiet:  # the next session starts unpaused
                paused = False
                _tracing.clear()
        resume()

    return remove


def _pause() -> None:
    global paused
    with _lock:
        paused = True
        entries = list(_quiet)
    for pause, _resume in entries:
        try:
            pause(PAUSE_WAIT_S)
        except Exception:
            _log.warning("otelprof: pausing a thread failed", exc_info=True)


def resume_if_clear() -> None:
    """At a step boundary: otelprof's threads start again once no with_stack profile of the
    user's is prepared (cheap while nothing is paused)."""
    global paused
    if not paused or any(_prepared(inner) for inner in list(_tracing)):
        return
    with _lock:
        paused = False
        entries = list(_quiet)
    for _pause_fn, resume in entries:
        try:
            resume()
        except Exception:
            _log.warning("otelprof: resuming a thread failed", exc_info=True)


def active() -> str | None:
    """What other profiler is on or prepared in this process (None: none). Call it while no
    window of otelprof's runs: the autograd profiler's flag is set by otelprof's own too."""
    if _daemon:
        return "Kineto on-demand tracing (KINETO_USE_DAEMON)"
    if _memory_history:
        return "CUDA memory-history recording"
    for observer in list(_observers):
        if observer.is_running():
            return "an ExecutionTraceObserver"
    if any(getattr(prof, "step_rec_fn", None) is not None for prof in list(_outer)):
        return "torch.profiler.profile"  # a scheduled one, its step range open
    if any(_prepared(inner) for inner in list(_inner)):  # a torch.profiler.profile's among them
        return "torch.profiler (or the autograd profiler)"
    if _unseen and _unseen_profile():
        return "a torch.profiler.profile made before otelprof instrumented the process"
    import torch.autograd.profiler as autograd_profiler

    if getattr(autograd_profiler, "_is_profiler_enabled", False) or _profiler_enabled():
        return "the autograd profiler (emit_nvtx, emit_itt or another)"
    return None


def _unseen_profile() -> bool:
    """Whether a ``torch.profiler.profile`` may exist: torch counts its steps from its creation
    until its ``__exit__``. Asked for one made before the wrappers were in place (one driven by
    start()/stop() stays counted, and otelprof's windows then keep giving way)."""
    from torch.autograd.profiler import KinetoStepTracker

    return "ProfilerStep" in getattr(KinetoStepTracker, "_step_dict", {})


def _prepared(inner: Any) -> bool:
    """An autograd profile prepared (by the user) and not yet stopped: its results are still the
    ones it had when it was prepared."""
    if inner is None:
        return False
    try:
        results = _inner[inner]
    except (KeyError, TypeError):
        return False
    return getattr(inner, "kineto_results", None) is results


def _profiler_enabled() -> bool:
    import torch

    probe = getattr(torch._C._autograd, "_profiler_enabled", None)
    return bool(probe()) if probe is not None else False


def _starting(what: str) -> None:
    global starts
    starts += 1
    for listener in list(_listeners):
        try:
            listener(what)
        except Exception:  # never into the user's profiler start
            _log.warning("otelprof: giving way to %s failed", what, exc_info=True)


#: Modules torch imports inside the first profile it starts. Its Python tracer keeps pointers
#: into the code object such an import runs and frees: a with_stack profile's events() then
#: raised UnicodeDecodeError in about 1 first profile in 2 (bare torch 2.13, CPU). Imported here
#: (0.6 ms), before any profile, they are not; otelprof's first window imports them anyway.
LAZY_MODULES = ("torch.profiler.python_tracer", "torch.profiler._cupti_monitor")


def _import_lazy_modules() -> None:
    import importlib

    for name in LAZY_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = owner.__dict__.get(name)
    if original is None:
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(owner, name, wrapper)
    _originals.append((owner, name, original, wrapper))


def _install() -> None:
    import torch.autograd.profiler as autograd_profiler
    import torch.profiler.profiler as torch_profiler

    def outer_init(original: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if not _ours():
                _starting("torch.profiler.profile")
                _outer.add(self)
            original(self, *args, **kwargs)

        return __init__

    def prepare(original: Any) -> Any:
        def _prepare_trace(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not _ours():
                _starting("torch.autograd.profiler.profile")
                _inner[self] = getattr(self, "kineto_results", None)
                if getattr(self, "with_stack", False):  # its Python tracer sees every thread
                    _tracing.add(self)
                    _pause()
            return original(self, *args, **kwargs)

        return _prepare_trace

    def on_start(original: Any) -> Any:
        def _run_on_profiler_start(*args: Any, **kwargs: Any) -> Any:
            if not _ours():
                _starting("the autograd profiler")
            return original(*args, **kwargs)

        return _run_on_profiler_start

    def register(original: Any) -> Any:
        def register_callback(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _ours():  # a window's own (profiling.py): part of the window
                return original(self, *args, **kwargs)
            _starting("an ExecutionTraceObserver")
            _observers.add(self)
            return original(self, *args, **kwargs)

        return register_callback

    _wrap(torch_profiler.profile, "__init__", outer_init)
    _wrap(autograd_profiler.profile, "_prepare_trace", prepare)
    _wrap(autograd_profiler, "_run_on_profiler_start", on_start)
    _wrap(torch_profiler.ExecutionTraceObserver, "register_callback", register)
    _wrap_memory_history()


def _wrap_memory_history() -> None:
    import sys

    memory = sys.modules.get("torch.cuda.memory")
    if memory is None:
        return

    def history(original: Any) -> Any:
        def _record_memory_history(*args: Any, **kwargs: Any) -> Any:
            global _memory_history
            enabled = kwargs.get("enabled", args[0] if args else "all")
            if enabled:
                _starting("CUDA memory-history recording")
            result = original(*args, **kwargs)
            _memory_history = bool(enabled)
            return result

        return _record_memory_history

    _wrap(memory, "_record_memory_history", history)
