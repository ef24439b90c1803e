"""Profiling windows: torch's profiler driven by the step tracker's boundaries.

Each window is a profiler of its own, made when the window's warmup step begins (Kineto
prepared), started at its first recorded step and stopped when its last ends, with no schedule:
between windows nothing of torch's profiler exists, so no ``ProfilerStep#N`` range is open and
torch's step tracker never moves (ranges are otelprof's own, opened after Kineto starts and
closed before it stops). Which steps are recorded follows torch's schedule (skip_first, wait,
warmup, active, repeat) with one early window first (``early`` steps into the run, so a short
run still records operators), and an on-demand request (signal, trigger file,
``POST /profile``) or a slow step overrides it for the next window. The window's trigger
(``early``, ``schedule``, ``on_demand``, ``anomaly``) goes with its steps' mark onto their
``train.step`` spans (``otelprof.window.trigger``).

Kineto has one session per process, and it is the user's: a window due while another profiler
is on is skipped, and one in progress stops unrecorded when another starts (``coexist.py``),
counted in ``otelprof_windows_skipped_total``. Steps another profiler ran beside are marked.

When a window ends, Kineto stops on the training thread (unavoidable: the profiler is that
thread's) and the results go to the conversion thread (``conversions.py``): it saves the trace
(Kineto writes it, GIL released), keeps a gzip-compressed copy (``keep.py``), converts it with
the native core (GIL released), hands the requests to the exporter and frees the results
there. ``ProfilerStep#N`` numbers follow the tracker's, and each recorded step's live span ids
go with the window (``LiveStep``): its operators land under that step's ``train.step`` span,
in the phase span that ran them. Steps inside a window and the one after it (it pays the
profiler's stop) are marked and never feed or trigger the slow-step (anomaly) detection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import statistics
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...converter import ConvertOptions, LiveStep
from .. import coexist
from ..metrics.window_metrics import WindowMetrics
from .conversions import Conversions, Job, temp_path
from .keep import KeepSettings, TraceKeeper

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
    execution_trace: bool = False  # torch's ExecutionTraceObserver beside each window (execution_trace.py)
    trigger_file: str | None = None  # its appearance starts a window (the file is then removed)
    trigger_signal: int | None = None  # e.g. signal.SIGUSR2
    on_demand_steps: int = 2
    anomaly_factor: float = 0.0  # profile after a step slower than factor x rolling median (0: off)
    anomaly_cooldown_s: float = 600.0
    # the windows' raw traces kept on disk (keep.py)
    keep: KeepSettings = dataclasses.field(default_factory=KeepSettings)


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

    @property
    def pending(self) -> bool:
        """Requested, not yet seen at a step boundary."""
        return self._steps != 0


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


class Windows:
    def __init__(
        self,
        settings: WindowSettings,
        options: ConvertOptions,
        submit: Callable[[bytes], None],
        metrics: WindowMetrics | None = None,
    ) -> None:
        import torch
        from torch.profiler import ProfilerActivity, schedule

        self.settings = settings
        self.on_demand = OnDemand(settings.on_demand_steps)
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
        self.overhead_s = 0.0  # training-thread time of windows' starts and stops
        self.windows_skipped = 0  # windows not recorded: another profiler was on, or started
        self._activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            self._activities.append(ProfilerActivity.CUDA)
        keeper = TraceKeeper(settings.keep, metrics.trace_not_kept if metrics is not None else lambda: None)
        self.conversions = Conversions(options, submit, metrics, keeper)
        # steps another profiler ran beside (start and end set), for trace_handler()'s windows
        self.user_steps: deque[LiveStep] = deque(maxlen=MAX_LIVE_STEPS)
        self._pending_user: Path | None = None  # the user's saved window, queued when its step ends
        # the window in progress: torch's profiler (None between windows), its state, the open
        # ProfilerStep#N range; a lock, as another thread may start its own profiler
        self._lock = threading.RLock()
        self._kineto: Any = None
        self._et: tuple[Any, Path] | None = None  # the window's execution trace observer and file
        self._last: Any = None  # the last window's profiler, until the next window begins
        self._state = _IDLE
        self._range: Any = None
        self._step_num = 0  # the profiler's step count: ProfilerStep#N labels
        self._current: Any = None  # the running step's action (None before begin)
        self._suppressed = False  # the rest of this window's steps record nothing (skipped)
        self._raw_last: Any = None  # the schedule's own action for the running step
        self._starts_seen = coexist.starts
        self._other_on = False  # another profiler was on at the last boundary
        self._started = False
        self._owner = threading.get_ident()
        self._ended_at: float | None = None  # time.monotonic() when the last window ended
        self._requested_at: float | None = None  # ... and of the last request_on_demand() accepted
        self._old_handler: Any = None
        if settings.trigger_signal is not None and threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(settings.trigger_signal, lambda _s, _f: self.on_demand.request())

    # --- called by the session at step boundaries (training thread) ------------------------

    def begin(self, step_number: int) -> str | None:
        """The first step begins: the profiler's step count starts at its number. Returns the
        step's mark (``mark()``)."""
        with self._lock:
            self._step_num = step_number
            self._owner = threading.get_ident()  # the training thread: torch's profiler is its
            if self.settings.early > 0 and self._early_fits():
                self._early_start = step_number + self.settings.early
            self._started = True
            self._current = self._enter(step_number)
            self._trigger = self._next_trigger
            return self.mark()

    def mark(self) -> str | None:
        """What the step now beginning is to the profiler, for its span's
        ``otelprof.step.window``: "recorded" (in a window's trace), "warmup" (the profiler runs,
        its events are discarded), "after" (the step right after a window: it pays the
        window's stop), or None. These are the steps kept out of the anomaly median. A window's
        steps ("warmup", "recorded") carry its trigger after a colon (``"recorded:early"``):
        the span encoders split it into ``otelprof.step.window`` and ``otelprof.window.trigger``."""
        from torch.profiler import ProfilerAction

        action = self._current
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
        from torch.profiler import ProfilerAction

        with self._lock:
            if not self._started:
                return None
            # the step ended before this callback (at the tracker's clock): its ProfilerStep range
            # ends first, before the work below (the converter cuts what is left to the step)
            if self._range is not None:
                self._close_range()
            action = self._current  # the ended step's
            label = self._step_num  # its ProfilerStep#label: the profiler counts boundaries
            if live is not None and action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
                step = live()
                if step is not None and len(self._live) < MAX_LIVE_STEPS:
                    # a framework numbers its steps itself (and only at their end): ProfilerStep#label
                    # still goes under that step's train.step, in its trace
                    # and its ProfilerStep#label says what started the window
                    self._live.append(dataclasses.replace(step, number=label, trigger=self._trigger))
            # another profiler ran in this step: its time is partly that profiler's
            # (it started in this step, is on now, or was on when this step began)
            on = self._state == _IDLE and coexist.active() is not None
            other = self._starts_seen != coexist.starts or on or self._other_on
            self._starts_seen, self._other_on = coexist.starts, on
            pending = self._pending_user is not None
            if (other or pending) and live is not None and action == ProfilerAction.NONE:
                self._user_step(live, step_seconds)
            if pending:
                self._queue_user()
            marked = action != ProfilerAction.NONE or self._after_window or other
            if marked:
                self.marked_steps.append(label if number is None else number)
            self._check_triggers(step_seconds, marked)
            self._saved = False
            start = time.perf_counter_ns()
            state = self._state
            self._step_num = label + 1
            self._current = self._enter(label + 1, ended=action)
            self._trigger = self._next_trigger
            if self._state != state or self._saved:  # Kineto started or stopped here: the window's cost
                self._overhead(time.perf_counter_ns() - start)
            self._after_window, self._saved = self._saved, False
            return self.mark()

    def _user_step(self, live: Callable[[], LiveStep | None], seconds: float) -> None:
        """A step the user's profiler ran beside: its span ids and times (its own; without them,
        the tracker's clock is the wall clock and the step ended about now), for ``convert_user``."""
        step = live()
        if step is not None:
            if not step.end_ns:
                end = time.time_ns()
                step = dataclasses.replace(step, start_ns=max(0, end - int(seconds * 1e9)), end_ns=end)
            self.user_steps.append(dataclasses.replace(step, trigger="user"))

    def _overhead(self, ns: int) -> None:
        """Training-thread time of a window's start or stop (the step pays it; it is marked)."""
        self.overhead_s += ns / 1e9
        if self.metrics is not None:
            self.metrics.window_overhead(ns / 1e9)

    def stop(self) -> None:
        """Stops a window in progress (saved, queued for conversion); no window starts after.
        Only on the thread whose steps it records: torch's profiler state is that thread's
        (stopped from another, Kineto finds no session and torch crashes)."""
        with self._lock:
            if not self._started:
                return
            self._started = False
            if self._state != _IDLE and threading.get_ident() != self._owner:
                self._kineto, self._range, self._state = None, None, _IDLE
                _log.warning("otelprof: a profiling window in progress is dropped: it can only stop on its own thread")
                return
            # the run ends inside a recorded step: no train.step will take its ProfilerStep#N
            unfinished = self._step_num if self._range is not None else None
            self._close_range()
            if self._state == _RECORDING:
                self._stop_and_save(unfinished)
            elif self._state == _PREPARED:
                self._discard()

    def close(self, timeout_s: float = 60.0) -> None:
        """Stops the profiler (``stop()``), waits up to ``timeout_s`` for the conversions, and
        releases torch's profiler objects here rather than at interpreter exit."""
        self.stop()
        on_main = threading.current_thread() is threading.main_thread()
        if self._old_handler is not None and self.settings.trigger_signal is not None and on_main:
            signal.signal(self.settings.trigger_signal, self._old_handler)
        with self._lock:
            if self._pending_user is not None:
                self._queue_user()
        self.conversions.close(max(0.0, timeout_s))
        self._live = []
        self._last = None

    # --- on demand over HTTP (a server thread) -------------------------------------------------

    def request_on_demand(self, steps: int | None, min_interval_s: float) -> tuple[str, float]:
        """A window for the next ``steps`` (None: the default) unless one is requested, pending or
        running ("busy"), or the last one ended, or was requested, less than ``min_interval_s``
        ago ("too_soon"); else "accepted". Also returns the seconds to wait before asking again."""
        with self._lock:  # a boundary takes a request and schedules its window under it
            if self.on_demand.pending or self._demand_start is not None or self._state != _IDLE:
                return "busy", min_interval_s
            now = time.monotonic()
            last = max((t for t in (self._ended_at, self._requested_at) if t is not None), default=None)
            if last is not None and now - last < min_interval_s:
                return "too_soon", min_interval_s - (now - last)
            self._requested_at = now
            self.on_demand.request(steps)
            return "accepted", 0.0

    # --- sharing the process's one profiler (coexist.py) --------------------------------------

    def give_way(self, what: str) -> None:
        """Another profiler is about to start (any thread): a window in progress stops now,
        unrecorded, and its remaining steps record nothing."""
        with self._lock:
            if self._state == _IDLE:
                return
            self._close_range()
            self._discard()
            self._suppressed = True
            self._live = []
            self._current = _none_action()  # the rest of the running step records nothing
            self._skipped(what)

    def _skipped(self, what: str) -> None:
        self.windows_skipped += 1
        if self.metrics is not None:
            self.metrics.window_skipped("user_profiler")
        global _skip_logged
        if not _skip_logged:
            _skip_logged = True
            _log.info(
                "otelprof: %s is profiling this process; otelprof's profiling windows give way to it "
                '(counted in otelprof_windows_skipped_total{reason="user_profiler"})',
                what,
            )

    # --- schedule ------------------------------------------------------------------------------

    def _early_fits(self) -> bool:
        """The early window ends before the schedule's first one begins (else that one is early
        enough and the early window is left out)."""
        s = self.settings
        return s.early + s.warmup + s.active <= s.skip_first + s.wait

    def _enter(self, step: int, ended: Any = None) -> Any:
        """Step ``step`` begins after a step whose action was ``ended``: moves torch's profiler
        to the state the step's action needs (prepared for a warmup step, recording with a
        ``ProfilerStep#step`` range for a recorded one) and returns that action (NONE where a
        window gives way to another profiler)."""
        from torch.profiler import ProfilerAction

        raw = self._action(step)
        window_ended = self._raw_last == ProfilerAction.RECORD_AND_SAVE or raw == ProfilerAction.NONE
        self._raw_last = raw
        if self._suppressed and window_ended:
            self._suppressed = False
        self._close_range()
        recording = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        if self._state == _RECORDING and (ended == ProfilerAction.RECORD_AND_SAVE or raw not in recording):
            self._stop_and_save()
        action = ProfilerAction.NONE if self._suppressed else raw
        if action == ProfilerAction.NONE:
            if self._state == _PREPARED:
                self._discard()
            return action
        if self._state == _IDLE:
            other = coexist.active()
            if other is not None:
                self._suppressed = True
                self._skipped(other)
                return ProfilerAction.NONE
            self._prepare()
        if action != ProfilerAction.WARMUP:
            if self._state == _PREPARED:
                with _own():
                    self._kineto.start_trace()
                self._state = _RECORDING
            self._range = _open_range(f"ProfilerStep#{step}")
        return action

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
        if self._demand_start is not None or self._current != ProfilerAction.NONE:
            return  # a window is already on its way
        self._demand_start = self._step_num + 1
        self._demand_steps = requested or self.settings.on_demand_steps
        self._demand_trigger = "anomaly" if anomaly else "on_demand"
        early = self._early_start
        if early is not None and self._demand_start < early + self.settings.warmup + self.settings.active:
            self._early_start = None  # this window comes first: it is the run's early one
        _log.info("otelprof: profiling steps from %d on demand", self._demand_start + self.settings.warmup)

    # --- torch's profiler, one object per window -------------------------------------------------

    def _prepare(self) -> None:
        """A window's first step: Kineto is prepared (its warmup) by a profiler of otelprof's own,
        without a schedule, so torch opens no step range and advances no step tracker."""
        from torch.profiler.profiler import _KinetoProfile

        self._last = None  # the previous window's results, freed in this marked step
        s = self.settings
        self._et = _observer() if s.execution_trace else None
        # torch categorizes memory from shapes and stacks: profile_memory turns both on
        kineto = _KinetoProfile(
            activities=self._activities,
            record_shapes=s.record_shapes or s.profile_memory,
            profile_memory=s.profile_memory,
            with_stack=s.with_stack or s.profile_memory,
            with_flops=s.with_flops,
            with_modules=s.with_modules,
            execution_trace_observer=self._et[0] if self._et is not None else None,
        )
        with _own():
            kineto.prepare_trace()
        self._kineto, self._state = kineto, _PREPARED
        self.conversions.ready()

    def _discard(self) -> None:
        """Ends a window without keeping it (torch's own way out of a warmup: start, then stop)."""
        kineto, self._kineto, state = self._kineto, None, self._state
        self._state, self._ended_at = _IDLE, time.monotonic()
        if kineto is None:
            return
        try:
            with _own():
                if state == _PREPARED:
                    kineto.start_trace()
                kineto.stop_trace()
        except Exception:
            _log.warning("otelprof: stopping a profiling window failed", exc_info=True)
        finally:
            _finish_observer(self._take_et(), keep=False)

    def _stop_and_save(self, unfinished: int | None = None) -> None:
        kineto, self._kineto = self._kineto, None
        self._state, self._ended_at = _IDLE, time.monotonic()
        et = self._take_et()
        try:
            with _own():
                kineto.stop_trace()
        except Exception:
            _finish_observer(et, keep=False)
            self._failed()
            _log.warning("otelprof: stopping a profiling window failed", exc_info=True)
            return
        self._ready(kineto, unfinished, _finish_observer(et, keep=True))

    def _take_et(self) -> tuple[Any, Path] | None:
        et, self._et = self._et, None
        return et

    def _close_range(self) -> None:
        step_range, self._range = self._range, None
        if step_range is not None:
            with contextlib.suppress(Exception):
                step_range.__exit__(None, None, None)

    # --- traces ------------------------------------------------------------------------------

    def _ready(self, prof: Any, unfinished: int | None = None, et: Path | None = None) -> None:
        """On the training thread (Kineto has stopped): hand the results to the conversion
        thread, which saves them, on a machine with cores to spare. With few cores, or where
        torch merges more into the file (its CUPTI monitor) or keeps no results object, the
        trace is saved here: in no phase (the trackers start the next phase after a boundary's
        callbacks) and counted as the window's overhead. ``unfinished``: the ProfilerStep#N
        of a step the window stopped in (dropped from the conversion); ``et``: the window's
        execution trace file (the conversion thread joins, keeps and removes it)."""
        trigger, self._demand_trigger = self._trigger, None
        live, self._live = tuple(self._live), []
        self._saved = True
        source: Any = None
        try:
            inner = getattr(prof, "profiler", None)
            source = getattr(inner, "kineto_results", None)
            memory = source if self.settings.profile_memory else None  # capture/memory/
            flops = source if self.settings.with_flops else None  # metrics/mfu.py: not in the JSON
            if (
                not self.save_off_thread
                or inner is None
                or source is None
                or getattr(prof, "_use_cupti_monitor", False)
            ):
                source = temp_path()
                prof.export_chrome_trace(str(source))
                self.save_threads.append(threading.current_thread().name)
            else:
                inner.kineto_results = None  # the conversion thread holds the only reference
            job = Job(source, trigger, live, unfinished=unfinished, memory=memory, flops=flops, execution_trace=et)
            et = None  # the job owns it now
            self.conversions.put(job)
            # freeing torch's results costs milliseconds: paid in the next window's warmup step
            # (or at close), as with torch's own scheduled profiler, not in the step after this
            self._last = prof
        except Exception:
            self._failed()
            _log.warning("otelprof: saving a profiling window failed", exc_info=True)
        finally:
            if et is not None:
                et.unlink(missing_ok=True)

    def pause(self, wait_s: float) -> None:
        """Stops the conversion thread once it is done (see ``coexist.quiet``)."""
        self.conversions.pause(wait_s)

    def convert_user(self, path: Path) -> None:
        """The user's own window, saved at ``path`` (``trace_handler()``): converted as a window of
        otelprof's, its steps matched by time to the live steps the user's profiler ran beside.
        It goes to the conversion thread when the running step ends (the user's last profiled
        step usually ends after the window: torch's ``prof.step()`` comes before the next batch)."""
        with self._lock:
            if self._pending_user is not None:
                self._queue_user()
            self._pending_user = path
            if not self._started:
                self._queue_user()

    def _queue_user(self) -> None:
        path, self._pending_user = self._pending_user, None
        live = tuple(self.user_steps)
        self.user_steps.clear()
        self.conversions.put(Job(path, "user", live, "time"))

    @property
    def windows_done(self) -> int:
        return self.conversions.done

    @property
    def windows_failed(self) -> int:
        return self.conversions.failed

    @property
    def save_threads(self) -> deque[str]:
        return self.conversions.save_threads

    @property
    def _options(self) -> ConvertOptions:
        return self.conversions.options

    def _failed(self) -> None:
        self.conversions.count_failure()


#: Where torch's profiler is in a window: none, prepared (a warmup step), recording.
_IDLE, _PREPARED, _RECORDING = 0, 1, 2
_skip_logged = False  # "otelprof gives way" is logged once per process


def _none_action() -> Any:
    from torch.profiler import ProfilerAction

    return ProfilerAction.NONE


#: torch's warning when a profiler object prepares a second cycle: otelprof makes one per
#: window, and the user can do nothing about it (filtered around otelprof's own calls only)
_CLEARS_EVENTS = r"Warning: Profiler clears events at the end of each cycle"


@contextlib.contextmanager
def _own() -> Iterator[None]:
    """otelprof's own calls of torch's profiler: unseen by coexist's wrappers, and without
    torch's warning about cycles (the user's filters are restored as they were)."""
    with coexist.own(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_CLEARS_EVENTS, category=UserWarning)
        yield


def _observer() -> tuple[Any, Path] | None:
    """A window's own ExecutionTraceObserver, writing to a fresh temp file (None: torch has none,
    or it cannot register: the window records without one, logged once)."""
    path = temp_path(".et.json")
    try:
        from torch.profiler import ExecutionTraceObserver

        with _own():
            observer = ExecutionTraceObserver().register_callback(str(path))
        if observer.is_registered:
            return observer, path
    except Exception:
        _log.debug("otelprof: an execution trace observer could not register", exc_info=True)
    path.unlink(missing_ok=True)
    global _et_logged
    if not _et_logged:
        _et_logged = True
        _log.warning("otelprof: windows record no execution trace: torch's observer could not register")
    return None


def _finish_observer(et: tuple[Any, Path] | None, keep: bool) -> Path | None:
    """Unregisters a window's observer (torch finishes the file then); the file when ``keep``
    and it was written, else it is removed."""
    if et is None:
        return None
    observer, path = et
    try:
        with _own():
            observer.unregister_callback()
    except Exception:
        keep = False
        _log.warning("otelprof: finishing a window's execution trace failed", exc_info=True)
    if keep and path.is_file() and path.stat().st_size:
        return path
    path.unlink(missing_ok=True)
    return None


_et_logged = False


def _open_range(name: str) -> Any:
    """A recorded step's ``ProfilerStep#N`` range, opened after Kineto starts and closed before
    it stops (a range that straddles a start or stop corrupts torch's profiler state)."""
    from torch.autograd.profiler import record_function

    step_range = record_function(name)
    step_range.__enter__()  # type: ignore[no-untyped-call]
    return step_range
