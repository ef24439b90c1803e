"""Step boundaries and phases from what the training loop does, with no code change.

The hooks (hooks.py) report activity; this module decides where one step ends and the next
begins. Rules:

- A step starts at the first activity (data fetch, forward, backward, optimizer step).
- With a DataLoader in use, a step ends where the next batch is fetched after at least one
  optimizer step: steps tile the loop, each beginning with its data wait, and every optimizer
  stepping in one iteration (GAN generator and discriminator, several param groups' optimizers)
  falls in one step. A fetch that finds no optimizer step since the last one restarts the step
  instead: evaluation loops and epoch ends are not training steps.
- Without a DataLoader, a step ends at the last optimizer step before new work (forward or
  backward) starts: consecutive optimizer steps with no work between them count as one step.
- ``step()`` called by the application ends the step explicitly and turns the automatic rules off,
  as ``step_scope()`` does for loops without an optimizer (inference, evaluation).

Phases are intervals inside the step; nested calls of one phase (a module calling another,
an LBFGS closure) count once, by their outermost call.

The native core runs these rules in C++ (``NativeStepTracker``, ``native/src/step_tracker.cpp``),
its hooks plain C functions torch calls directly: in Python each event cost ~1.5 us on the
training thread. ``StepTracker`` here is the reference (property-tested equal,
tests/capture/test_steps.py) and the fallback without the native core. Both offer the hooks
(``begin_forward`` ...): each ignores its arguments, returns None and never raises: a failure
stops the tracker and goes to ``on_error`` once.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PHASES = ("data", "forward", "backward", "optimizer")
#: Phase intervals kept per step (gradient accumulation makes several); later ones are counted.
MAX_PHASE_SPANS = 64


@dataclass(slots=True)
class Step:
    number: int
    start_ns: int  # epoch nanoseconds
    end_ns: int
    phases: list[tuple[str, int, int]] = field(default_factory=list)  # (phase, start, end), in order
    phase_totals_ns: dict[str, int] = field(default_factory=dict)
    dropped_phases: int = 0
    samples: int | None = None
    tokens: int | None = None
    name: str = "train.step"

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _now_ns() -> int:
    return time.time_ns()


def _ignore(_step: Step) -> None:
    pass


#: What the hooks call (torch passes a module, an optimizer... which the hooks ignore).
HOOKS = (
    "begin_data",
    "end_data",
    "data_end",
    "begin_forward",
    "end_forward",
    "begin_backward",
    "end_backward",
    "begin_optimizer",
    "end_optimizer",
)


class TrackerHooks:
    """The hooks both trackers offer (HOOKS), set per instance."""

    begin_data: Callable[..., None]
    end_data: Callable[..., None]
    data_end: Callable[..., None]
    begin_forward: Callable[..., None]
    end_forward: Callable[..., None]
    begin_backward: Callable[..., None]
    end_backward: Callable[..., None]
    begin_optimizer: Callable[..., None]
    end_optimizer: Callable[..., None]


class StepTracker(TrackerHooks):
    """Thread-safe; ``on_step`` runs on the thread that ended the step and must not raise
    (the caller guards it)."""

    def __init__(
        self,
        on_step: Callable[[Step], None],
        first_step: int = 0,
        clock: Callable[[], int] = _now_ns,
        on_first_open: Callable[[int], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._on_step = on_step
        self._on_error = on_error
        self.failed = False
        for phase in PHASES:  # the hooks: begin_data, end_data, begin_forward, ...
            setattr(self, f"begin_{phase}", self._hook(self.phase_begin, phase))
            setattr(self, f"end_{phase}", self._hook(self.phase_end, phase))
        self._on_first_open = on_first_open
        self._clock = clock
        self._lock = threading.RLock()
        self._next_number = first_step
        self._current: Step | None = None
        self._depth = dict.fromkeys(PHASES, 0)
        self._phase_start = dict.fromkeys(PHASES, 0)
        self._explicit = False  # the application calls step() / step_scope()
        self._dataloader = False  # a DataLoader iterator has been seen
        self._optimized = False  # an optimizer stepped in the current step
        self._pending_end: int | None = None  # no-DataLoader rule: the last optimizer step's end
        self._samples: int | None = None
        self._tokens: int | None = None

    # --- hooks: never raise ----------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """Stops the tracker (an internal error); ``on_error`` hears of it once."""
        if not self.failed:
            self.failed = True
            if self._on_error is not None:
                self._on_error(exc)

    def _hook(self, event: Callable[[str], None], phase: str) -> Callable[..., None]:
        def hook(*_: Any) -> None:  # torch passes a module, an optimizer...: ignored
            self._guarded(event, phase)

        return hook

    def _guarded(self, event: Callable[..., None], *args: Any) -> None:
        if not self.failed:
            try:
                event(*args)
            except Exception as exc:
                self.fail(exc)

    # --- phases -----------------------------------------------------------------------------

    def phase_begin(self, phase: str) -> None:
        with self._lock:
            if self._depth[phase] and self._current is not None and self._pending_end is None and phase != "data":
                self._depth[phase] += 1  # a nested call (a submodule's forward): no timestamp needed
                return
            now = self._clock()
            if phase == "data":
                self._on_data_fetch(now)
            elif phase in ("forward", "backward") and self._pending_end is not None:
                end = self._pending_end
                self._close(end)
                self._open(end)  # the loop's tail (logging, zero_grad) belongs to the next step
            if self._current is None:
                self._open(now)
            if self._depth[phase] == 0:
                self._phase_start[phase] = now
            self._depth[phase] += 1

    def phase_end(self, phase: str) -> None:
        with self._lock:
            self._phase_end(phase)

    def _phase_end(self, phase: str) -> None:
        depth = self._depth[phase]
        if depth == 0:  # began before instrumentation
            return
        self._depth[phase] = depth = depth - 1
        step = self._current
        if depth or step is None:
            return
        now = self._clock()
        start = self._phase_start[phase]
        totals = step.phase_totals_ns
        totals[phase] = totals.get(phase, 0) + (now - start)
        if len(step.phases) < MAX_PHASE_SPANS:
            step.phases.append((phase, start, now))
        else:
            step.dropped_phases += 1
        if phase == "optimizer":
            self._optimized = True
            if not self._dataloader and not self._explicit:
                self._pending_end = now

    def set_batch(self, samples: int | None = None, tokens: int | None = None) -> None:
        """Samples/tokens of the current step (inferred from the batch, or set by the application)."""
        with self._lock:
            self._set_batch(samples, tokens)

    def data_end(self, samples: int | None = None, tokens: int | None = None) -> None:
        """``phase_end("data")`` and ``set_batch()`` of the batch fetched, under one lock (a hook)."""
        self._guarded(self._data_end, samples, tokens)

    def _data_end(self, samples: int | None, tokens: int | None) -> None:
        with self._lock:
            self._phase_end("data")
            if samples is not None:
                self._samples = samples
            if tokens is not None:
                self._tokens = tokens

    def _set_batch(self, samples: int | None, tokens: int | None) -> None:
        if samples is not None:
            self._samples = samples
        if tokens is not None:
            self._tokens = tokens

    # --- explicit steps (the application) ---------------------------------------------------

    def step(self) -> None:
        """Ends the current step now (the next begins at once)."""
        with self._lock:
            self._explicit = True
            now = self._clock()
            if self._current is None:
                self._open(now)
            self._close(now)
            self._open(now)

    def begin_scope(self, name: str) -> None:
        with self._lock:
            self._explicit = True
            now = self._clock()
            if self._current is not None and self._current.phases:
                self._close(now)  # work since the last boundary is a step of its own
            self._open(now)
            assert self._current is not None
            self._current.name = name

    def end_scope(self) -> None:
        with self._lock:
            if self._current is not None:
                self._close(self._clock())

    def close(self) -> None:
        """After finish(): the callbacks go (a hook torch still holds must not keep the session
        alive) and every later event is ignored."""
        self.failed = True
        self._on_step = _ignore
        self._on_first_open = self._on_error = None

    def finish(self) -> None:
        """At shutdown: a step that saw an optimizer step (or an explicit one) is complete."""
        with self._lock:
            if self._pending_end is not None:
                self._close(self._pending_end)
            elif self._current is not None and self._optimized:
                self._close(self._clock())
            self._current = None

    # --- internals --------------------------------------------------------------------------

    def _on_data_fetch(self, now: int) -> None:
        self._dataloader = True
        self._pending_end = None
        if self._explicit or self._current is None:
            return
        if self._optimized:
            self._close(now)
        else:
            self._current = None  # no training since the last fetch: start over here

    def _open(self, now: int) -> None:
        self._current = Step(-1, now, now)  # numbered when it closes: discarded ones take none
        self._optimized = False
        if self._on_first_open is not None:
            first, self._on_first_open = self._on_first_open, None
            first(self._next_number)

    def _close(self, end: int) -> None:
        step, self._current = self._current, None
        self._pending_end = None
        if step is None:
            return
        step.end_ns = max(end, step.start_ns)
        step.number = self._next_number
        self._next_number += 1
        step.samples, step.tokens = self._samples, self._tokens
        self._samples = self._tokens = None
        # phases still running (a forward that spans the boundary) continue into the next step
        self._on_step(step)


try:
    _native: Any = importlib.import_module("otelprof._native")
except ImportError:  # pragma: no cover - a broken build; the Python tracker takes over
    _native = None


class NativeStepTracker(TrackerHooks):
    """The native core's tracker with StepTracker's interface; ``hooks`` are C functions."""

    def __init__(
        self,
        on_step: Callable[[Step], None],
        first_step: int = 0,
        clock: Callable[[], int] = _now_ns,
        on_first_open: Callable[[int], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        # time.time_ns is read in C (CLOCK_REALTIME, the same clock); another is called
        native = _native.StepTracker(
            on_step, Step, first_step, None if clock in (_now_ns, time.time_ns) else clock, on_first_open, on_error
        )
        self._native = native
        self.phase_begin: Callable[[str], None] = native.phase_begin
        self.phase_end: Callable[[str], None] = native.phase_end
        self.set_batch: Callable[..., None] = native.set_batch
        self.step: Callable[[], None] = native.step
        self.begin_scope: Callable[[str], None] = native.begin_scope
        self.end_scope: Callable[[], None] = native.end_scope
        self.finish: Callable[[], None] = native.finish
        self.fail: Callable[[BaseException], None] = native.fail
        for name in HOOKS:
            setattr(self, name, native.hook(name))

    @property
    def failed(self) -> bool:
        return bool(self._native.failed)

    def close(self) -> None:
        """After finish(): drops the callbacks (a cycle through C++ that gc cannot break)."""
        self._native.release()

    def attach(
        self,
        sink: Any,
        on_boundary: Callable[[int, float], None] | None = None,
        parent: Callable[[], tuple[bytes, bytes] | None] | None = None,
        context_var: Any = None,
        notify: Callable[[], None] | None = None,
    ) -> None:
        """Closed steps go to ``sink`` (``_native.StepSink``: metrics folded, spans queued, in
        C++) instead of ``on_step``; ``parent()`` gives the application's current span (looked
        up only when ``context_var``, OpenTelemetry's context variable, is not empty), and
        ``on_boundary(number, seconds)`` runs per step for what Python still does there."""
        self._native.attach(sink, on_boundary, parent, context_var, notify)


def step_tracker(
    on_step: Callable[[Step], None],
    clock: Callable[[], int] = _now_ns,
    on_first_open: Callable[[int], None] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
    native: bool = True,
) -> StepTracker | NativeStepTracker:
    """The native tracker when the core is built (``native=False``: the Python reference)."""
    if native and _native is not None:
        return NativeStepTracker(on_step, clock=clock, on_first_open=on_first_open, on_error=on_error)
    return StepTracker(on_step, clock=clock, on_first_open=on_first_open, on_error=on_error)
