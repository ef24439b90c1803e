"""Step and phase times from CUDA events, read back without synchronizing the device.

With CUDA in use, the CPU reaches a step boundary long before the GPU finishes the step's
kernels, so CPU wall time measures launch, not work. Here every timestamp the step tracker takes
also records a CUDA event on the current stream; a finished step waits in a short queue until
its last event has completed (``query()``, never ``synchronize()``), then its times are
replaced by the device's: the step keeps its CPU start as anchor and gets the device-measured
durations between its events. Steps are therefore reported a step or two late, in order. If
the GPU falls further behind than ``MAX_PENDING`` steps, the oldest is reported with CPU times
(logged once); so is any step whose events are missing (CUDA initialised mid-step).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from .tracker import Step

_log = logging.getLogger(__name__)
MAX_PENDING = 64


class Event(Protocol):
    """The part of ``torch.cuda.Event`` used here."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Any) -> float: ...  # milliseconds
    def synchronize(self) -> None: ...


class DeviceTiming:
    def __init__(
        self,
        emit: Callable[[Step, Any], None],
        new_event: Callable[[], Event],
        active: Callable[[], bool],
        wall_clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._emit = emit  # (step with device times, the context the caller attached)
        self._new_event = new_event
        self._active = active  # False until CUDA is initialised (never initialise it here)
        self._wall = wall_clock
        self._events: dict[int, Event] = {}
        self._free: list[Event] = []
        self._pending: deque[tuple[Step, Any]] = deque()
        self.cpu_fallbacks = 0

    def clock(self) -> int:
        """The step tracker's clock: a CPU timestamp, and a CUDA event recorded at it."""
        now = self._wall()
        if now not in self._events and self._active():
            event = self._free.pop() if self._free else self._new_event()
            event.record()
            self._events[now] = event
        return now

    def add(self, step: Step, context: Any) -> None:
        """A step ended on the CPU: report it once the device has run it."""
        self._pending.append((step, context))
        while len(self._pending) > MAX_PENDING:
            old, ctx = self._pending.popleft()
            self._fallback(old, f"the GPU is more than {MAX_PENDING} steps behind")
            self._emit(old, ctx)
        self.drain()

    def drain(self, wait: bool = False) -> None:
        """Reports every pending step whose events have completed (``wait``: all, at shutdown)."""
        while self._pending:
            step, ctx = self._pending[0]
            end = self._events.get(step.end_ns)
            if end is not None and not end.query():
                if not wait:
                    return
                end.synchronize()
            self._pending.popleft()
            cpu_end = step.end_ns
            self._to_device_times(step)
            self._release(cpu_end)
            self._emit(step, ctx)

    def _to_device_times(self, step: Step) -> None:
        start = self._events.get(step.start_ns)
        end = self._events.get(step.end_ns)
        if start is None or end is None or not start.query():
            self._fallback(step, "CUDA events are missing for it")
            return
        anchor = step.start_ns

        def at(ns: int) -> int | None:
            event = self._events.get(ns)
            if event is None or not event.query():
                return None
            return anchor + max(0, round(start.elapsed_time(event) * 1e6))

        step_end = at(step.end_ns)
        assert step_end is not None
        phases = []
        for phase, s, e in step.phases:
            ds, de = at(s), at(e)
            if ds is None or de is None:  # a phase that began before CUDA was initialised
                self._fallback(step, "a phase has no CUDA event")
                return
            phases.append((phase, ds, max(ds, de)))
        step.end_ns = max(step_end, anchor)
        step.phases = phases
        if not step.dropped_phases:  # totals of phases beyond the kept ones stay CPU-measured
            totals: dict[str, int] = {}
            for phase, s, e in phases:
                totals[phase] = totals.get(phase, 0) + (e - s)
            step.phase_totals_ns = totals

    def _release(self, up_to_ns: int) -> None:
        """Recycles the events before ``up_to_ns`` (the next step starts at that one)."""
        for ns in [ns for ns in self._events if ns < up_to_ns]:
            self._free.append(self._events.pop(ns))

    def _fallback(self, step: Step, why: str) -> None:
        self.cpu_fallbacks += 1
        if self.cpu_fallbacks == 1:
            _log.info("otelprof: step %d is timed on the CPU (%s); later ones may be too", step.number, why)


def cuda_timing(emit: Callable[[Step, Any], None]) -> DeviceTiming | None:
    """Device timing when this torch has CUDA (events start once the program initialises it)."""
    import torch

    if not torch.cuda.is_available():
        return None
    # torch.cuda.Event.__new__ is unannotated (the Event protocol above types what is used)
    return DeviceTiming(emit, lambda: torch.cuda.Event(enable_timing=True), torch.cuda.is_initialized)  # type: ignore[no-untyped-call]
