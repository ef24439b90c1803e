"""The native core's step tracker (``native/src/step_tracker.cpp``) behind StepTracker's
interface, and ``step_tracker()``, which picks it when the core is built (else the reference)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..._native_module import native as _native
from .step import HOOKS, UPDATE_HOOK, Step, TrackerHooks, now_ns
from .tracker import StepTracker


class NativeStepTracker(TrackerHooks):
    """The native core's tracker with StepTracker's interface; ``hooks`` are C functions."""

    def __init__(
        self,
        on_step: Callable[[Step], None],
        first_step: int = 0,
        clock: Callable[[], int] = now_ns,
        on_first_open: Callable[[int], object] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        grad_enabled: Callable[[], bool] | None = None,
        on_hint: Callable[[int], None] | None = None,
    ) -> None:
        # time.time_ns is read in C (CLOCK_REALTIME, the same clock); another is called
        native = _native.StepTracker(
            on_step,
            Step,
            first_step,
            None if clock in (now_ns, time.time_ns) else clock,
            on_first_open,
            on_error,
            grad_enabled,
            on_hint,
        )
        self._native = native
        self.phase_begin: Callable[..., None] = native.phase_begin  # (phase, key, module name)
        self.phase_end: Callable[[str], None] = native.phase_end
        self.set_batch: Callable[..., None] = native.set_batch
        self.step: Callable[..., None] = native.step
        self.begin_scope: Callable[..., None] = native.begin_scope
        self.end_scope: Callable[[], None] = native.end_scope
        self.finish: Callable[[], None] = native.finish
        self.abandon: Callable[[], int] = native.abandon
        self.fail: Callable[[BaseException], None] = native.fail
        for name in (*HOOKS, UPDATE_HOOK):
            setattr(self, name, native.hook(name))

    @property
    def failed(self) -> bool:
        return bool(self._native.failed)

    @property
    def eval_forwards(self) -> int:
        return int(self._native.eval_forwards)

    def close(self) -> None:
        """After finish(): drops the callbacks (a cycle through C++ that gc cannot break)."""
        self._native.release()

    def attach(
        self,
        sink: Any,
        on_boundary: Callable[[int, float], str | None] | None = None,
        parent: Callable[[], tuple[bytes, bytes] | None] | None = None,
        context_var: Any = None,
        notify: Callable[[], None] | None = None,
        on_held: Callable[[], None] | None = None,
        probe: Callable[[], tuple[int | None, int | None, int | None, int] | None] | None = None,
        probe_when: dict[str, Any] | None = None,
    ) -> None:
        """Closed steps go to ``sink`` (``_native.StepSink``: metrics folded, spans queued, in
        C++) instead of ``on_step``; ``parent()`` gives the application's current span (looked
        up only when ``context_var``, OpenTelemetry's context variable, is not empty), and
        ``on_boundary(number, seconds)`` runs per step for what Python still does there and
        returns the next step's profiling-window mark (``Step.window``; ``on_first_open``'s
        return value is the first step's); ``on_held()`` runs after each step a device-timed sink
        holds (``sink.hold()``), to release those the device has run; ``probe()`` before each
        training step is queued, for its memory (``StepRecord.memory``), with ``probe_when`` (a
        module's globals: torch.cuda's) only once its ``_initialized`` is True."""
        self._native.attach(sink, on_boundary, parent, context_var, notify, on_held, probe, probe_when)


def step_tracker(
    on_step: Callable[[Step], None],
    clock: Callable[[], int] = now_ns,
    on_first_open: Callable[[int], object] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
    native: bool = True,
    grad_enabled: Callable[[], bool] | None = None,
    on_hint: Callable[[int], None] | None = None,
) -> StepTracker | NativeStepTracker:
    """The native tracker when the core is built (``native=False``: the Python reference)."""
    kind = NativeStepTracker if native and _native is not None else StepTracker
    return kind(
        on_step,
        clock=clock,
        on_first_open=on_first_open,
        on_error=on_error,
        grad_enabled=grad_enabled,
        on_hint=on_hint,
    )
