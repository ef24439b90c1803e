"""Profiling windows: torch.profiler driven by the step tracker's boundaries.

One ``torch.profiler.profile`` lives for the whole run with a schedule callable; Kineto runs only
in warmup and active steps, so the steps in between cost one ``prof.step()`` call. The
schedule is torch's own (skip_first, wait, warmup, active, repeat) with one early window first
(``early`` steps into the run, so a short run still records operators), and an on-demand
request (signal, trigger file, ``POST /profile``) or a slow step overrides it for the next
window. The window's trigger (``early``, ``schedule``, ``on_demand``, ``anomaly``) goes with its
steps' mark onto their ``train.step`` spans (``otelprof.window.trigger``).

When a window ends, torch stops Kineto on the training thread (unavoidable: the profiler is
that thread's) and calls ``on_trace_ready``, which hands the results to a background thread:
it saves the trace (Kineto writes it, GIL released), converts it with the native core (GIL
released), hands the requests to the exporter and frees the results there. ``ProfilerStep#N``
numbers follow the tracker's, and each recorded step's live span ids go with the window
(``LiveStep``): its operators land under that step's ``train.step`` span, in the phase span
that ran them. Steps inside a window and the one after it (it pays the profiler's stop) are
marked and never feed or trigger the slow-step (anomaly) detection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import signal
import statistics
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...converter import ConvertOptions, LiveStep, convert
from ..metrics.window_metrics import WindowMetrics, summarize

_log = logging.getLogger(__name__)
#: Cores at which a window's trace is saved off the training thread. Below, a background save
#: competes with torch's own threads and costs the loop more than saving in place (2 cores,
#: benchmarks/overhead.py: window ratio 1.065 saving in the background, 1.022 in place).
SAVE_OFF_THREAD_MIN_CPUS = 8


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class WindowSettings:
    enabled: bool = True
    skip_first: int = 10
    wait: int = 500
    warmup: int = 1
    active: int = 2
    repeat: int = 0  # 0: forever
    early: int = 10  # one window whose warmup is this many steps into the run (0: none)
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    trigger_file: str | None = None  # its appearance starts a window (the file is then removed)
    trigger_signal: int | None = None  # e.g. signal.SIGUSR2
    on_demand_steps: int = 2
    anomaly_factor: float = 0.0  # profile after a step slower than factor x rolling median (0: off)
    anomaly_cooldown_s: float = 600.0


class OnDemand:
    """A window for the next N steps, requested from another thread, a signal or a file."""

    def __init__(self, default_steps: int) -> None:
        self._default = default_steps
        self._steps = 0  # 0: nothing requested (a plain int: set from a signal handler)

    def request(self, steps: int | None = None) -> None:
        self._steps = steps or self._default

    def take(self) -> int:
        """Steps requested since the last call (0: none)."""
        steps, self._steps = self._steps, 0
        return steps


class Anomaly:
    """Slow-step detection: a step slower than ``factor`` x the rolling median of the last
    ``HISTORY`` unmarked steps, at most once per cooldown. Marked steps (inside or right after
    a profiling window: their time is partly the profiler's) neither enter the median nor trigger."""

    HISTORY = 50
    MIN_HISTORY = 10

    def __init__(self, factor: float, cooldown_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.factor = factor
        self.cooldown_s = cooldown_s
        self._clock = clock
        self.history: deque[float] = deque(maxlen=self.HISTORY)
        self._last: float | None = None
        self.skipped = 0  # marked steps seen

    def observe(self, seconds: float, marked: bool = False) -> bool:
        """True when this step should start an anomaly window."""
        if marked:
            self.skipped += 1
            return False
        slow = False
        if self.factor > 0 and len(self.history) >= self.MIN_HISTORY:
            median = statistics.median(self.history)
            now = self._clock()
            cooled = self._last is None or now - self._last >= self.cooldown_s
            if seconds > self.factor * median and cooled:
                self._last = now
                slow = True
                _log.info("otelprof: a %.3f s step (median %.3f s): profiling the next steps", seconds, median)
        self.history.append(seconds)
        return slow


#: Live step ids kept for the window in progress (a longer on-demand window keeps its first ones).
MAX_LIVE_STEPS = 1000
#: A job for the conversion thread: the torch results (or a saved file), trigger, live steps.
_Job = tuple[Any, str, tuple[LiveStep, ...]]


class Windows:
    def __init__(
        self,
        settings: WindowSettings,
        options: ConvertOptions,
        submit: Callable[[bytes], None],
        metrics: WindowMetrics | None = None,
    ) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self.settings = settings
        self.on_demand = OnDemand(settings.on_demand_steps)
        # one thread: a window's conversion runs beside training and must not take a second core
        self._options = dataclasses.replace(options, threads=1)
        self._submit = submit
        self.metrics = metrics
        self._base = schedule(
            skip_first=settings.skip_first,
            wait=settings.wait,
            warmup=settings.warmup,
            active=settings.active,
            repeat=settings.repeat,
        )
        self._demand_start: int | None = None  # first warmup step of an on-demand window
        self._demand_trigger: str | None = None  # "on_demand" or "anomaly", until its trace is saved
        self._early_start: int | None = None  # the early window's warmup step (begin() sets it)
        self._next_trigger = "schedule"  # the trigger of the action _action returned last
        self._trigger = "schedule"  # the trigger of the step now running (when it is a window's)
        self._demand_steps = settings.on_demand_steps
        self.anomaly = Anomaly(settings.anomaly_factor, settings.anomaly_cooldown_s)
        self._live: list[LiveStep] = []  # recorded steps of the window in progress
        self._saved = False  # a window's trace was handed over at this boundary
        self.save_off_thread = _cpus() >= SAVE_OFF_THREAD_MIN_CPUS
        self._after_window = False  # the step now running follows a window's end
        self.marked_steps: deque[int] = deque(maxlen=64)  # step numbers kept out of the anomaly median
        self.save_threads: deque[str] = deque(maxlen=16)  # where each window's trace was saved
        self.overhead_s = 0.0  # training-thread time of windows' starts and stops
        self.windows_done = 0
        self.windows_failed = 0
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=4)
        self._worker = threading.Thread(target=self._convert_loop, name="otelprof-windows", daemon=True)
        self._worker.start()
        self._prof: Any = profile(
            activities=activities,
            schedule=self._action,
            on_trace_ready=self._ready,
            record_shapes=settings.record_shapes,
            profile_memory=settings.profile_memory,
            with_stack=settings.with_stack,
            with_flops=settings.with_flops,
            with_modules=settings.with_modules,
        )
        self._started = False
        self._old_handler: Any = None
        if settings.trigger_signal is not None and threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(settings.trigger_signal, lambda _s, _f: self.on_demand.request())

    # --- called by the session at step boundaries (training thread) ------------------------

    def begin(self, step_number: int) -> str | None:
        """The first step begins: the profiler's step count starts at its number. Returns the
        step's mark (``mark()``)."""
        self._prof.step_num = step_number
        if self.settings.early > 0 and self._early_fits():
            self._early_start = step_number + self.settings.early
        self._prof.start()
        self._started = True
        return self.mark()

    def mark(self) -> str | None:
        """What the step now beginning is to the profiler, for its span's
        ``otelprof.step.window``: "recorded" (in a window's trace), "warmup" (the profiler runs,
        its events are discarded), "after" (the step right after a window: it pays the
        window's stop), or None. These are the steps kept out of the anomaly median. A window's
        steps ("warmup", "recorded") carry its trigger after a colon (``"recorded:early"``):
        the span encoders split it into ``otelprof.step.window`` and ``otelprof.window.trigger``."""
        from torch.profiler import ProfilerAction

        action = self._prof.current_action
        if action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            return "recorded:" + self._trigger
        if action == ProfilerAction.WARMUP:
            return "warmup:" + self._trigger
        return "after" if self._after_window else None

    def boundary(
        self, step_seconds: float, live: Callable[[], LiveStep | None] | None = None, number: int | None = None
    ) -> str | None:
        """Step ``number`` ended and the next begins; ``live()`` gives the ended step's span ids
        (asked only when the profiler recorded that step). Returns the next step's ``mark()``."""
        if not self._started:
            return None
        from torch.profiler import ProfilerAction

        action = self._prof.current_action  # the ended step's
        label = self._prof.step_num  # its ProfilerStep#label: the profiler counts boundaries
        if live is not None and action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            step = live()
            if step is not None and len(self._live) < MAX_LIVE_STEPS:
                # a framework numbers its steps itself (and only at their end): ProfilerStep#label
                # still goes under that step's train.step, in its trace
                # and its ProfilerStep#label says what started the window
                self._live.append(dataclasses.replace(step, number=label, trigger=self._trigger))
        marked = action != ProfilerAction.NONE or self._after_window
        if marked:
            self.marked_steps.append(label if number is None else number)
        self._check_triggers(step_seconds, marked)
        self._saved = False
        start = time.perf_counter_ns()
        self._prof.step()
        self._trigger = self._next_trigger
        if self._prof.current_action != action:  # Kineto started or stopped here: the window's cost
            self._overhead(time.perf_counter_ns() - start)
        self._after_window, self._saved = self._saved, False
        return self.mark()

    def _overhead(self, ns: int) -> None:
        """Training-thread time of a window's start or stop (the step pays it; it is marked)."""
        self.overhead_s += ns / 1e9
        if self.metrics is not None:
            self.metrics.window_overhead(ns / 1e9)

    def close(self) -> None:
        """Stops the profiler (a window in progress is saved and converted), waits for the
        conversions, and releases torch's profiler objects here rather than at interpreter exit."""
        if self._started:
            self._started = False
            self._prof.stop()
        if self._old_handler is not None and self.settings.trigger_signal is not None:
            signal.signal(self.settings.trigger_signal, self._old_handler)
        self._jobs.put(None)
        self._worker.join(timeout=60)
        self._prof = None
        self._live = []

    # --- schedule ------------------------------------------------------------------------------

    def _early_fits(self) -> bool:
        """The early window ends before the schedule's first one begins (else that one is early
        enough and the early window is left out)."""
        s = self.settings
        return s.early + s.warmup + s.active <= s.skip_first + s.wait

    def _action(self, step: int) -> Any:
        """torch's schedule for ``step``, overridden by an on-demand window, else the early one.
        Notes the trigger of the action it returns (``_next_trigger``)."""
        start = self._demand_start
        if start is not None and step >= start:
            action = self._window_action(step - start, self._demand_steps)
            if action is not None:
                self._next_trigger = self._demand_trigger or "on_demand"
                return action
            self._demand_start = None
        early = self._early_start
        if early is not None and step >= early:
            action = self._window_action(step - early, self.settings.active)
            if action is not None:
                self._next_trigger = "early"
                return action
            self._early_start = None
        self._next_trigger = "schedule"
        return self._base(step)

    def _window_action(self, offset: int, active: int) -> Any:
        """The action of a window's step ``offset`` steps after its first (None: past its end)."""
        from torch.profiler import ProfilerAction

        warmup = self.settings.warmup
        if offset < warmup:
            return ProfilerAction.WARMUP
        if offset < warmup + active - 1:
            return ProfilerAction.RECORD
        if offset == warmup + active - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return None

    def _check_triggers(self, step_seconds: float, marked: bool) -> None:
        from torch.profiler import ProfilerAction

        anomaly = self.anomaly.observe(step_seconds, marked)
        path = self.settings.trigger_file
        by_file = path is not None and os.path.exists(path)
        if by_file and path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        requested = self.on_demand.take()
        if not (requested or by_file or anomaly):
            return
        if self._demand_start is not None or self._prof.current_action != ProfilerAction.NONE:
            return  # a window is already on its way
        self._demand_start = self._prof.step_num + 1
        self._demand_steps = requested or self.settings.on_demand_steps
        self._demand_trigger = "anomaly" if anomaly else "on_demand"
        early = self._early_start
        if early is not None and self._demand_start < early + self.settings.warmup + self.settings.active:
            self._early_start = None  # this window comes first: it is the run's early one
        _log.info("otelprof: profiling steps from %d on demand", self._demand_start + self.settings.warmup)

    # --- traces ------------------------------------------------------------------------------

    def _ready(self, prof: Any) -> None:
        """On the training thread (Kineto has stopped): hand the results to the conversion
        thread, which saves them, on a machine with cores to spare. With few cores, or where
        torch merges more into the file (its CUPTI monitor) or keeps no results object, the
        trace is saved here: in no phase (the trackers start the next phase after a boundary's
        callbacks) and counted as the window's overhead."""
        # in the profiler's step() (the ended step's trigger) or stop() (the current step's)
        trigger, self._demand_trigger = self._trigger, None
        live, self._live = tuple(self._live), []
        self._saved = True
        source: Any = None
        try:
            inner = getattr(prof, "profiler", None)
            source = getattr(inner, "kineto_results", None)
            if (
                not self.save_off_thread
                or inner is None
                or source is None
                or getattr(prof, "_use_cupti_monitor", False)
            ):
                source = _temp_path()
                prof.export_chrome_trace(str(source))
                self.save_threads.append(threading.current_thread().name)
            else:
                inner.kineto_results = None  # the conversion thread holds the only reference
            self._jobs.put_nowait((source, trigger, live))
        except queue.Full:
            self._failed()
            if isinstance(source, Path):
                source.unlink(missing_ok=True)
            _log.warning("otelprof: windows arrive faster than they convert; dropping one (counted)")
        except Exception:
            self._failed()
            _log.warning("otelprof: saving a profiling window failed", exc_info=True)

    def _failed(self) -> None:
        self.windows_failed += 1
        if self.metrics is not None:
            self.metrics.window_failed()

    def _convert_loop(self) -> None:
        _lower_priority()
        while (job := self._jobs.get()) is not None:
            source, trigger, live = job
            job = None
            path: Path | None = source if isinstance(source, Path) else None
            try:
                if path is None:
                    path = _temp_path()
                    source.save(str(path))  # Kineto writes the JSON with the GIL released
                    self.save_threads.append(threading.current_thread().name)
                source = None  # torch's results are freed here, on this thread
                options = dataclasses.replace(self._options, live_steps=live) if live else self._options
                result = convert(path, options=options)
                for request in result.requests:
                    self._submit(request)
                self.windows_done += 1
                if self.metrics is not None:
                    self.metrics.window_done(trigger, summarize(result.ops))
            except Exception:
                self._failed()
                _log.warning("otelprof: converting a profiling window failed", exc_info=True)
            finally:
                source = None
                if path is not None:
                    path.unlink(missing_ok=True)


def _temp_path() -> Path:
    fd, name = tempfile.mkstemp(prefix="otelprof-window-", suffix=".json")
    os.close(fd)
    return Path(name)


#: Niceness of the conversion thread: on a machine with few free cores the training thread
#: gets the CPU first, and the window's conversion takes the time left over.
CONVERT_NICENESS = 10


def _lower_priority() -> None:
    """Linux schedules threads one by one: this lowers the calling thread only."""
    with contextlib.suppress(AttributeError, OSError):
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, current + CONVERT_NICENESS))
