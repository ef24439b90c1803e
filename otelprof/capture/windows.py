"""Profiling windows: torch.profiler driven by the step tracker's boundaries.

One ``torch.profiler.profile`` lives for the whole run with a schedule callable; Kineto runs only
in warmup and active steps, so the steps in between cost one ``prof.step()`` call. The
schedule is torch's own (skip_first, wait, warmup, active, repeat), and an on-demand request
(signal or trigger file) or a slow step overrides it for the next window.

When a window ends, torch calls ``on_trace_ready`` on the training thread: the trace is saved
to a temporary file there (Kineto writes it), and a background thread converts it with the
native core (GIL released) and hands the requests to the exporter. ``ProfilerStep#N`` numbers
follow the tracker's, so a window's operator spans land in the traces of the live step spans.
"""

from __future__ import annotations

import contextlib
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

from ..converter import ConvertOptions, convert
from .window_metrics import WindowMetrics, summarize

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WindowSettings:
    enabled: bool = True
    skip_first: int = 10
    wait: int = 500
    warmup: int = 1
    active: int = 2
    repeat: int = 0  # 0: forever
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
        self._options = options
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
        self._demand_steps = settings.on_demand_steps
        self._durations: deque[float] = deque(maxlen=50)
        self._last_anomaly = 0.0
        self.windows_done = 0
        self.windows_failed = 0
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._jobs: queue.Queue[tuple[Path, str] | None] = queue.Queue(maxsize=4)
        self._worker = threading.Thread(target=self._convert_loop, name="otelprof-windows", daemon=True)
        self._worker.start()
        self._prof = profile(
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

    def begin(self, step_number: int) -> None:
        """The first step begins: the profiler's step count starts at its number."""
        self._prof.step_num = step_number
        self._prof.start()
        self._started = True

    def boundary(self, step_seconds: float) -> None:
        """A step ended and the next begins."""
        if not self._started:
            return
        self._check_triggers(step_seconds)
        self._prof.step()

    def close(self) -> None:
        if self._started:
            self._started = False
            self._prof.stop()  # a window in progress is saved and converted
        if self._old_handler is not None and self.settings.trigger_signal is not None:
            signal.signal(self.settings.trigger_signal, self._old_handler)
        self._jobs.put(None)
        self._worker.join(timeout=60)

    # --- schedule ------------------------------------------------------------------------------

    def _action(self, step: int) -> Any:
        from torch.profiler import ProfilerAction

        start = self._demand_start
        if start is not None and step >= start:
            offset = step - start
            warmup, active = self.settings.warmup, self._demand_steps
            if offset < warmup:
                return ProfilerAction.WARMUP
            if offset < warmup + active - 1:
                return ProfilerAction.RECORD
            if offset == warmup + active - 1:
                return ProfilerAction.RECORD_AND_SAVE
            self._demand_start = None
        return self._base(step)

    def _check_triggers(self, step_seconds: float) -> None:
        from torch.profiler import ProfilerAction

        anomaly = self._is_anomaly(step_seconds)
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
        _log.info("otelprof: profiling steps from %d on demand", self._demand_start + self.settings.warmup)

    def _is_anomaly(self, seconds: float) -> bool:
        factor = self.settings.anomaly_factor
        history = self._durations
        slow = False
        if factor > 0 and len(history) >= 10:
            median = statistics.median(history)
            now = time.monotonic()
            if seconds > factor * median and now - self._last_anomaly >= self.settings.anomaly_cooldown_s:
                self._last_anomaly = now
                slow = True
                _log.info("otelprof: a %.3f s step (median %.3f s): profiling the next steps", seconds, median)
        history.append(seconds)
        return slow

    # --- traces ------------------------------------------------------------------------------

    def _ready(self, prof: Any) -> None:
        """On the training thread: save the trace (Kineto does it), queue it for conversion."""
        trigger, self._demand_trigger = self._demand_trigger or "schedule", None
        try:
            fd, name = tempfile.mkstemp(prefix="otelprof-window-", suffix=".json")
            os.close(fd)
            prof.export_chrome_trace(name)
            self._jobs.put_nowait((Path(name), trigger))
        except queue.Full:
            self._failed()
            Path(name).unlink(missing_ok=True)
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
            path, trigger = job
            try:
                result = convert(path, options=self._options)
                for request in result.requests:
                    self._submit(request)
                self.windows_done += 1
                if self.metrics is not None:
                    self.metrics.window_done(trigger, summarize(result.ops))
            except Exception:
                self._failed()
                _log.warning("otelprof: converting a profiling window failed", exc_info=True)
            finally:
                path.unlink(missing_ok=True)


#: Niceness of the conversion thread: on a machine with few free cores the training thread
#: gets the CPU first, and the window's conversion takes the time left over.
CONVERT_NICENESS = 10


def _lower_priority() -> None:
    """Linux schedules threads one by one: this lowers the calling thread only."""
    with contextlib.suppress(AttributeError, OSError):
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, current + CONVERT_NICENESS))
