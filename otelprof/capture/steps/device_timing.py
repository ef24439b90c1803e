"""Step and phase times from CUDA events, read back without synchronizing the device.

With CUDA in use, the CPU reaches a step boundary long before the GPU finishes the step's
kernels, so CPU wall time measures launch, not work. Here every timestamp the step tracker takes
also records a CUDA event on the current stream; a finished step waits in a short queue until
its last event has completed (``query()``, never ``synchronize()``), then its times are
replaced by the device's: the step keeps its CPU start as anchor and gets the device-measured
durations between its events. Steps are therefore reported a step or two late, in order. If
the GPU falls further behind than ``MAX_PENDING`` steps, the oldest is reported with CPU times
(logged once); so is any step whose events are missing (CUDA initialised mid-step).

With the native core the steps wait in the native step sink instead (``StepSink.hold()``: their
span ids and window marks taken when they close, nothing folded or queued) and
``drain_sink()`` releases each with the device's times (``StepSink.release()``), the same
arithmetic as a Python ``Step`` gets here (tests/capture/test_step_sink.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from .step import Step

_log = logging.getLogger(__name__)
MAX_PENDING = 64


class Event(Protocol):
    """The part of ``torch.cuda.Event`` used here."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Any) -> float: ...  # milliseconds
    def synchronize(self) -> None: ...


class CpuEvent:
    """``Event`` on the CPU clock, complete once recorded: runs the device-timing route where no
    GPU is (``benchmarks/step_route.py``, tests)."""

    def __init__(self) -> None:
        self.at = 0

    def record(self) -> None:
        self.at = time.perf_counter_ns()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: CpuEvent) -> float:
        return (end.at - self.at) / 1e6

    def synchronize(self) -> None:
        pass


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
        self.max_pending = MAX_PENDING
        self.cpu_fallbacks = 0
        self._overflows = 0  # the native sink's held_overflows, counted so far

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
        while len(self._pending) > self.max_pending:
            old, ctx = self._pending.popleft()
            self._fallback(old.number, f"the GPU is more than {self.max_pending} steps behind")
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

    def drain_sink(self, sink: Any, released: Callable[[bool, bool], None], wait: bool = False) -> None:
        """The native route: releases every step the sink holds (``_native.StepSink.hold()``)
        whose events have completed, with the device's times (``wait``: all, at shutdown);
        ``released(training, wake)`` after each (``StepSink.release()``'s answer)."""
        overflows = sink.held_overflows  # the sink's own bound (hold(max_pending + 1)): unreleased
        if overflows > self._overflows:
            for _ in range(overflows - self._overflows):
                self._fallback(-1, f"the GPU is more than {self.max_pending} steps behind")
            self._overflows = overflows
        while sink.held_count > self.max_pending:  # as add(): the oldest keeps its CPU times
            held = sink.held()
            self._fallback(held[0], f"the GPU is more than {self.max_pending} steps behind")
            released(*sink.release())
        while True:
            held = sink.held()
            if held is None:
                return
            number, start_ns, end_ns, phases, _dropped = held
            end = self._events.get(end_ns)
            if end is not None and not end.query():
                if not wait:
                    return
                end.synchronize()
            device = self._device_times(number, start_ns, end_ns, phases)
            self._release(end_ns)
            released(*(sink.release() if device is None else sink.release(*device)))

    def _to_device_times(self, step: Step) -> None:
        device = self._device_times(step.number, step.start_ns, step.end_ns, [(s, e) for _p, s, e in step.phases])
        if device is None:
            return
        step.end_ns, intervals = device
        phases = [(phase, s, e) for (phase, _s, _e), (s, e) in zip(step.phases, intervals, strict=True)]
        step.phases = phases
        if not step.dropped_phases:  # totals of phases beyond the kept ones stay CPU-measured
            totals: dict[str, int] = {}
            for phase, s, e in phases:
                totals[phase] = totals.get(phase, 0) + (e - s)
            step.phase_totals_ns = totals

    def _device_times(
        self, number: int, start_ns: int, end_ns: int, phases: list[tuple[int, int]]
    ) -> tuple[int, list[tuple[int, int]]] | None:
        """The step's end and phase intervals on the device (anchored at its CPU start), or
        None: it keeps its CPU times."""
        start = self._events.get(start_ns)
        end = self._events.get(end_ns)
        if start is None or end is None or not start.query():
            self._fallback(number, "CUDA events are missing for it")
            return None
        anchor = start_ns

        def at(ns: int) -> int | None:
            event = self._events.get(ns)
            if event is None or not event.query():
                return None
            return anchor + max(0, round(start.elapsed_time(event) * 1e6))

        step_end = at(end_ns)
        assert step_end is not None
        intervals = []
        # a phase mostly starts where the previous one ended: its device time is known
        last_ns, last_at = end_ns, step_end
        for s, e in phases:
            ds = last_at if s == last_ns else at(s)
            de = at(e)
            if ds is None or de is None:  # a phase that began before CUDA was initialised
                self._fallback(number, "a phase has no CUDA event")
                return None
            last_ns, last_at = e, de
            intervals.append((ds, max(ds, de)))
        return max(step_end, anchor), intervals

    def _release(self, up_to_ns: int) -> None:
        """Recycles the events before ``up_to_ns`` (the next step starts at that one)."""
        for ns in [ns for ns in self._events if ns < up_to_ns]:
            self._free.append(self._events.pop(ns))

    def _fallback(self, number: int, why: str) -> None:
        """``number``: -1 when not known (the native sink released it)."""
        self.cpu_fallbacks += 1
        if self.cpu_fallbacks == 1:
            which = "a step" if number < 0 else f"step {number}"
            _log.info("otelprof: %s is timed on the CPU (%s); later ones may be too", which, why)


def cuda_timing(emit: Callable[[Step, Any], None]) -> DeviceTiming | None:
    """Device timing when this torch has CUDA (events start once the program initialises it)."""
    import torch

    if not torch.cuda.is_available():
        return None
    # torch.cuda.Event.__new__ is unannotated (the Event protocol above types what is used)
    return DeviceTiming(emit, lambda: torch.cuda.Event(enable_timing=True), torch.cuda.is_initialized)  # type: ignore[no-untyped-call]
