"""Step boundaries and phases from what the training loop does, with no code change.

The hooks (hooks.py) report activity; this module decides where one step ends and the next
begins. **One step is one optimizer update**, whatever the loop:

- All micro-batches between two updates belong to one step: its samples, tokens and
  micro-batches (DataLoader batches) are the sums over every fetch inside it, its phases the sums
  of their intervals.
- With a DataLoader in use, a step begins at the first fetch after the previous update and ends
  where the next fetch begins after at least one optimizer step: steps tile the loop, each
  beginning with its data wait, and every optimizer stepping once in one iteration (GAN
  generator and discriminator) falls in one step. A fetch that finds forwards but no backward
  since the step began drops that work instead (evaluation batches), and a fetch that finds the
  DataLoader exhausted does not begin a step (epoch ends).
- **An optimizer that already stepped in the current step, stepping again, starts a new step**:
  the step ends where its last optimizer step ended and the work since moves to the next one.
  Without a DataLoader, once a step has ended this way the set of optimizers of one update is
  known, and a step ends as soon as each of them has stepped (at the end of the last one; the
  loop's tail, zero_grad and logging, belongs to the next step). So a GAN with no DataLoader
  (D and G each stepping once per iteration) gives one step per iteration; a critic stepping
  five times per generator update gives five steps, one per update.
- Phases never overlap: a phase that begins inside another (the forward and backward an
  LBFGS or Lightning closure runs inside ``optimizer.step(closure)``) pauses it, so the optimizer
  phase is the optimizer's own time. Nested calls of one phase count once, by the outermost.
- What runs at a boundary on the training thread (the step callback: the profiler's step, where
  a window starts or stops) is no phase's time: the clock is read again after it and the phase
  that began at the boundary starts then. Steps keep their boundaries (they tile), so that
  stretch is phase-less time at the start of the next step (its cost is counted on its own).
- A forward that begins while a backward runs (on any thread: the autograd engine's device
  threads included) is recomputation (activation checkpointing, reentrant or not): backward's
  time, no forward phase and no forward pass.
- A forward under ``torch.no_grad()`` / ``inference_mode`` outside any step is evaluation: timed
  in no step and counted (``eval_forwards``, the ``otelprof_eval_forwards_total`` metric), as is
  forward-only work a fetch drops (an evaluation DataLoader's batches). After the step's update
  (automatic rules), no-grad forwards are the step's work (an EMA teacher, a metric) while they
  are no more than it usually has: the previous step's count, or one per micro-batch's training
  forwards (at least one); one more makes them evaluation from the first beyond the previous
  step's count on: the step ends where that forward began, and they and later ones are counted
  (held-out tensors evaluated between updates). At shutdown, those after the last update are
  evaluation.
- An update a gradient scaler skipped (``GradScaler.step`` found inf/NaN gradients and did not
  call ``optimizer.step()``: the hooks open the optimizer phase at the scaler's step and end it
  with ``end_update``) is an update all the same: the step ends as after any update, and is
  ``skipped`` when no optimizer update in it ran.
- The explicit API turns the automatic boundaries off (the dropping of forward-only work at a
  fetch stays): ``step(number=None, samples=None, tokens=None, micro_batches=None)`` ends the
  current step now (numbered ``number`` when given, the next counting on from it;
  ``samples``/``tokens`` replace the sums of its fetches, ``micro_batches`` their count: a
  framework that fetches ahead, or splits one fetched batch, knows its own); the next step
  begins at its first activity (a fetch, forward, backward or optimizer step), or, when none
  came, at the previous boundary.
  A scope opened right after a fetch (``for x in loader: with step_scope(...)``) takes that
  fetch's samples, tokens and micro-batch.
  ``begin_scope(name)`` / ``end_scope()`` make one named step of a block (inference,
  evaluation), with every forward in it charged; ``begin_scope(name, evaluation=True)`` (a
  framework's evaluation) makes it a span that is no training step: it takes no step number
  (it carries the next step's), its forwards are counted in ``eval_forwards``, and it feeds no
  step metric. ``otelprof.step()`` / ``otelprof.step_scope()``
  / ``otelprof.set_batch_size()`` are these for the application and for framework callbacks.
- A loop that runs forwards with no optimizer step and no explicit step gets one log line
  saying how to mark steps (``on_hint``, after HINT_FORWARDS forwards; once a backward has run,
  after HINT_TRAINING_FORWARDS: gradient accumulation runs many before the first update).

The native core runs these rules in C++ (``NativeStepTracker`` in native_tracker.py,
``native/src/step_tracker.cpp``),
its hooks plain C functions torch calls directly: in Python each event cost ~1.5 us on the
training thread. ``StepTracker`` here is the reference (property-tested equal,
tests/capture/test_steps.py) and the fallback without the native core. Both offer the hooks
(``begin_forward`` ...): each returns None and never raises (a failure stops the tracker and goes
to ``on_error`` once); they read only the optimizer a ``begin_optimizer`` gets (its identity) and,
at a forward, ``grad_enabled()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .step import (
    HINT_FORWARDS,
    HINT_TRAINING_FORWARDS,
    MAX_OPTIMIZERS,
    MAX_PHASE_SPANS,
    PHASES,
    Step,
    TrackerHooks,
    check_count,
    module_name,
    now_ns,
)


def _ignore(_step: Step) -> None:
    pass


class StepTracker(TrackerHooks):
    """Thread-safe; ``on_step`` runs on the thread that ended the step and must not raise
    (the caller guards it). ``grad_enabled()`` tells a training forward from an evaluation one
    (``torch.is_grad_enabled``; None: every forward trains); ``on_hint(forwards)`` is called once
    when forwards run with no optimizer step and no explicit step."""

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
        self._on_step = on_step
        self._on_error = on_error
        self._on_hint = on_hint
        self._grad_enabled = grad_enabled
        self.failed = False
        for phase in PHASES:  # the hooks: begin_data, end_data, begin_forward, ...
            setattr(self, f"begin_{phase}", self._hook(self._begin_hook, phase))
            setattr(self, f"end_{phase}", self._hook(self.phase_end, phase))
        self.end_data = self._hook(self._end_data, "data")  # a fetch that found no batch
        self.end_update = self._hook(self._end_update, "optimizer")  # a scaler's step returned
        self._on_first_open = on_first_open
        self._clock = clock
        self._lock = threading.RLock()
        self._next_number = first_step
        self._current: Step | None = None
        self._stack: list[str] = []  # running phases, innermost last
        self._depth = dict.fromkeys(PHASES, 0)
        self._phase_start = dict.fromkeys(PHASES, 0)
        self._untimed = dict.fromkeys(PHASES, False)  # an outermost call timed in no step
        self._module: dict[str, str | None] = dict.fromkeys(PHASES)  # the running call's module
        self._opt_key = 0  # the optimizer of the running optimizer phase
        self._explicit = False  # the application calls step() / step_scope()
        self._dataloader = False  # a DataLoader iterator has been seen
        self._known: list[int] | None = None  # the optimizers of the last step that had some
        self._boundary: int | None = None  # the last explicit boundary
        self._forwards_seen = 0
        self._optimizer_seen = False
        self._backward_seen = False
        self._recompute = 0  # forwards running inside a backward (recomputation)
        self._opt_inner = False  # an optimizer step ran inside the running optimizer phase
        self._skip = False  # the optimizer phase ending now is an update the scaler skipped
        self._kept = 0  # no-grad forwards after the update the last step kept as its own
        self._hinted = False
        self.eval_forwards = 0  # forwards charged to no step (evaluation)
        self._next_samples: int | None = None
        self._next_tokens: int | None = None
        self._at = 0  # when the event now running read the clock
        self._delivered = False  # the event ran a callback (a closed step, the first opening, the hint)
        self._reset_step()
        self._reset_batches()

    def _reset_step(self) -> None:
        """What the tracker knows of the current step's work."""
        self._optimized = False  # an optimizer step ended in it
        self._backward = False  # a backward began in it
        self._forwards = 0  # root forwards in it
        self._nograd = 0  # of which under no_grad
        self._opts: list[int] = []  # optimizers that stepped in it
        self._last_opt_end = 0
        self._scoped = False  # a step_scope(): every forward is its own
        self._updated = False  # an optimizer update ran in it
        self._skipped = False  # an update in it was skipped
        self._pending = 0  # no-grad forwards after its update (its own unless evaluation)
        self._pending_start = 0  # when the first of them began
        self._cut = 0  # when the one after those the last step kept began

    def _reset_batches(self) -> None:
        self._samples: int | None = None  # sums over the step's fetches
        self._tokens: int | None = None
        self._batches = 0
        self._set_batches: int | None = None  # step(micro_batches=...): replaces the fetch count
        # set_batch() / step(samples=...): they replace the sums; set_batch() after the step's
        # update (automatic rules) is for the next step
        self._set_samples, self._set_tokens = self._next_samples, self._next_tokens
        self._next_samples = self._next_tokens = None

    # --- hooks: never raise ----------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """Stops the tracker (an internal error); ``on_error`` hears of it once."""
        if not self.failed:
            self.failed = True
            if self._on_error is not None:
                self._on_error(exc)

    def _hook(self, event: Callable[..., None], phase: str) -> Callable[..., None]:
        def hook(*args: Any) -> None:  # torch passes a module, an optimizer...
            self._guarded(event, phase, *args[:1])

        return hook

    def _begin_hook(self, phase: str, target: Any = None) -> None:
        if phase == "forward":
            self.phase_begin(phase, 0, module_name(target))
        else:
            self.phase_begin(phase, id(target) if phase == "optimizer" and target is not None else 0)

    def _guarded(self, event: Callable[..., None], *args: Any) -> None:
        if not self.failed:
            try:
                event(*args)
            except Exception as exc:
                self.fail(exc)

    # --- phases -----------------------------------------------------------------------------

    def phase_begin(self, phase: str, key: int = 0, module: str | None = None) -> None:
        """``key`` tells optimizers apart (the hook passes the optimizer's identity); ``module``
        names a forward's root module (``module_name``)."""
        with self._lock:
            self._delivered = False
            self._phase_begin(phase, key, module)
            self._after_callbacks()

    def _after_callbacks(self) -> None:
        """The callbacks an event ran (a step boundary: the profiler's step, where a window
        starts or stops) took the time since the event read its clock (``_at``): the phase
        that began then restarts after them, so their cost is no phase's. The step keeps its
        boundary (steps tile): that stretch is phase-less time at the start of the step."""
        if not self._delivered:
            return
        self._delivered = False
        now = self._clock()
        if self._stack and now > self._at:
            top = self._stack[-1]
            if not self._untimed[top] and self._phase_start[top] == self._at:
                self._phase_start[top] = now

    def _phase_begin(self, phase: str, key: int, module: str | None) -> None:
        if phase == "forward" and self._depth["backward"]:
            self._recompute += 1  # autograd recomputes it (checkpointing): backward's time
            return
        if self._depth[phase] and phase == "data":  # the last fetch never ended: forget it
            self._depth[phase] = 0
            if phase in self._stack:
                self._stack.remove(phase)
        if self._depth[phase]:
            self._depth[phase] += 1  # a nested call (a submodule's forward): counted once
            if phase == "optimizer":
                self._opt_inner = True  # the optimizer stepped inside a scaler's step
            return
        grad = phase != "forward" or self._grad_enabled is None or bool(self._grad_enabled())
        now = self._at = self._clock()
        if phase == "forward":
            self._forward_seen()
        if self._stack:
            self._pause(now)
        elif self._decide(phase, key, grad, now):
            self._untimed[phase] = True
            self._depth[phase] = 1
            self.eval_forwards += 1
            return
        if self._current is None and self._stack:
            self._untimed[phase] = True  # inside an untimed call
        else:
            if self._current is None:
                self._open(now)
            self._untimed[phase] = False
        self._stack.append(phase)
        self._depth[phase] = 1
        self._phase_start[phase] = now
        self._module[phase] = module
        if phase == "forward":
            self._forwards += 1
            if not grad:
                self._nograd += 1
        elif phase == "backward":
            self._backward = self._backward_seen = True
        elif phase == "optimizer":
            self._opt_key = key
            self._opt_inner = False

    def _decide(self, phase: str, key: int, grad: bool, now: int) -> bool:
        """The boundaries an outermost activity decides; True: an evaluation forward (untimed)."""
        step = self._current
        if phase == "data":
            self._on_data_fetch(now)
        elif phase == "forward" and not grad:
            if step is not None and self._optimized and not self._scoped and not self._explicit:
                return self._after_update(now)
            if step is None or self._optimized or (not step.phases and not self._scoped):
                if step is not None and not self._scoped and not self._explicit:
                    self._discard()  # a step opened at the last update, nothing in it yet
                return step is None or not self._scoped
        elif phase == "optimizer" and step is not None and key in self._opts and not self._explicit:
            self._split()
        return False

    def _after_update(self, now: int) -> bool:
        """A no-grad forward after the step's update: the step's own (False) while no more than
        it usually has, else evaluation (True) from the first beyond the last step's count on."""
        self._pending += 1
        if self._pending == 1:
            self._pending_start = now
        if self._pending == self._kept + 1:
            self._cut = now
        per_batch = -(-(self._forwards - self._nograd) // max(1, self._batches))  # training forwards
        if self._pending <= max(1, self._kept, per_batch):
            return False
        self.eval_forwards += self._pending - 1 - self._kept  # this one: the caller's
        self._pending = self._kept
        self._cut_phases(self._cut)
        self._close(self._cut)
        return True

    def _pause(self, now: int) -> None:
        """The running phase stops while another runs inside it (a closure in optimizer.step);
        an empty stretch since it resumed (between a closure's forward and backward) is none."""
        top = self._stack[-1]
        if not self._untimed[top] and now > self._phase_start[top]:
            self._interval(top, self._phase_start[top], now, self._module[top])

    def phase_end(self, phase: str, _target: Any = None) -> None:
        with self._lock:
            self._delivered = False
            self._phase_end(phase)
            self._after_callbacks()

    def _phase_end(self, phase: str) -> bool:
        """True when the outermost call of ``phase`` ended."""
        if phase == "forward" and self._recompute:
            self._recompute -= 1
            return False
        depth = self._depth[phase]
        if depth == 0:  # began before instrumentation
            return False
        self._depth[phase] = depth = depth - 1
        if depth:
            return False
        now = self._at = self._clock()
        if phase in self._stack:
            self._stack.remove(phase)
        if phase == "backward":
            self._recompute = 0  # a recomputed forward's end that never came
        if self._untimed[phase]:
            self._untimed[phase] = False
            return True
        now = max(now, self._phase_start[phase])
        self._interval(phase, self._phase_start[phase], now, self._module[phase])
        if self._stack:
            self._phase_start[self._stack[-1]] = now  # the paused phase resumes
        elif phase == "optimizer" and self._current is not None:
            self._optimizer_done(now)
        return True

    def _interval(self, phase: str, start: int, end: int, module: str | None = None) -> None:
        step = self._current
        if step is None:
            return
        totals = step.phase_totals_ns
        totals[phase] = totals.get(phase, 0) + (end - start)
        if len(step.phases) < MAX_PHASE_SPANS:
            step.phases.append((phase, start, end))
            step.phase_modules.append(module)
        else:
            step.dropped_phases += 1

    def _optimizer_done(self, now: int) -> None:
        self._optimized = self._optimizer_seen = True
        if self._skip:
            self._skipped = True
        else:
            self._updated = True
        self._last_opt_end = now
        if self._opt_key not in self._opts and len(self._opts) < MAX_OPTIMIZERS:
            self._opts.append(self._opt_key)
        known = self._known
        if not self._dataloader and not self._explicit and known is not None and all(k in self._opts for k in known):
            self._close(now)  # every optimizer of an update has stepped: the update is done
            self._open(now)  # the loop's tail (zero_grad, logging) belongs to the next step

    def _forward_seen(self) -> None:
        self._forwards_seen += 1
        if (
            not self._hinted
            and self._forwards_seen >= (HINT_TRAINING_FORWARDS if self._backward_seen else HINT_FORWARDS)
            and not self._optimizer_seen
            and not self._explicit
        ):
            self._hinted = True
            if self._on_hint is not None:
                self._delivered = True
                self._on_hint(self._forwards_seen)

    def set_batch(self, samples: int | None = None, tokens: int | None = None) -> None:
        """Samples/tokens of the current step (set by the application): they replace the sums
        of the step's fetches."""
        check_count(samples)
        check_count(tokens)
        with self._lock:
            self._set_batch(samples, tokens)

    def _set_batch(self, samples: int | None, tokens: int | None) -> None:
        later = self._optimized and not self._explicit  # after the update: the next step's
        if samples is not None:
            if later:
                self._next_samples = samples
            else:
                self._set_samples = samples
        if tokens is not None:
            if later:
                self._next_tokens = tokens
            else:
                self._set_tokens = tokens

    def data_end(self, samples: int | None = None, tokens: int | None = None) -> None:
        """``phase_end("data")`` of a fetch that gave a batch of that size (a hook)."""
        self._guarded(self._data_end, samples, tokens)

    def _data_end(self, samples: int | None, tokens: int | None) -> None:
        with self._lock:
            if not self._phase_end("data"):
                return
            self._batches += 1
            if samples is not None:
                self._samples = (self._samples or 0) + samples
            if tokens is not None:
                self._tokens = (self._tokens or 0) + tokens

    def _end_update(self, _phase: str = "optimizer", _target: Any = None) -> None:
        """The end of the optimizer phase a scaler's step opened: skipped when no optimizer
        step ran inside it."""
        with self._lock:
            self._delivered = False
            self._skip = self._depth["optimizer"] == 1 and not self._opt_inner
            try:
                self._phase_end("optimizer")
            finally:
                self._skip = False
            self._after_callbacks()

    def _end_data(self, _phase: str = "data", _target: Any = None) -> None:
        with self._lock:
            if not self._phase_end("data"):
                return
            step = self._current
            if step is not None and not (
                self._forwards or self._backward or self._optimized or self._batches or self._scoped
            ):
                self._discard()  # the DataLoader was exhausted: no step begins here

    # --- explicit steps (the application, framework callbacks) ------------------------------

    def step(
        self,
        number: int | None = None,
        samples: int | None = None,
        tokens: int | None = None,
        micro_batches: int | None = None,
    ) -> None:
        """Ends the current step now; see the module docstring."""
        check_count(number, "a step number")
        check_count(samples)
        check_count(tokens)
        check_count(micro_batches, "a micro-batch count")
        with self._lock:
            self._explicit = True
            self._delivered = False
            now = self._at = self._clock()
            if samples is not None:
                self._set_samples = samples
            if micro_batches is not None:
                self._set_batches = micro_batches
            if tokens is not None:
                self._set_tokens = tokens
            if self._current is None:
                self._open(now if self._boundary is None else self._boundary)
            self._close(now, number)
            self._boundary = now
            self._after_callbacks()

    def begin_scope(self, name: str, evaluation: bool = False) -> None:
        with self._lock:
            self._explicit = True
            self._delivered = False
            now = self._at = self._clock()
            fetched = None
            if self._current is not None:
                if self._backward or self._optimized:
                    self._close(now)  # training since the last boundary is a step of its own
                else:
                    if not self._forwards:  # a fetch just before: the scope's batch
                        fetched = (self._samples, self._tokens, self._batches)
                    self._discard()
            self._open(now)
            if fetched is not None:
                self._samples, self._tokens, self._batches = fetched
            assert self._current is not None
            self._current.name = name
            self._current.evaluation = evaluation
            self._scoped = True
            self._after_callbacks()

    def end_scope(self) -> None:
        with self._lock:
            if self._current is not None:
                self._delivered = False
                now = self._at = self._clock()
                self._close(now)
                self._boundary = now
                self._after_callbacks()

    def close(self) -> None:
        """After finish(): the callbacks go (a hook torch still holds must not keep the session
        alive) and every later event is ignored."""
        self.failed = True
        self._on_step = _ignore
        self._on_first_open = self._on_error = self._on_hint = None
        self._grad_enabled = None

    def finish(self) -> None:
        """At shutdown: a step that saw an optimizer step is complete (it ends where its last
        optimizer step ended); anything else open is dropped."""
        with self._lock:
            if self._current is not None and self._optimized and not self._scoped:
                if self._pending:  # no-grad forwards after the last update: evaluation
                    self.eval_forwards += self._pending
                    self._pending = 0
                    self._cut_phases(self._pending_start)
                self._close(self._last_opt_end)
            elif self._current is not None:
                self._discard()

    def abandon(self) -> int:
        """An error ended the open step and its span was made elsewhere (an out-of-memory
        step's, memory/oom.py): the step is dropped, so neither a later boundary nor finish() closes
        it again, and its number is taken. Returns that number."""
        with self._lock:
            if self._current is not None:
                self._discard()
            number = self._next_number
            self._next_number += 1
            return number

    # --- internals --------------------------------------------------------------------------

    def _on_data_fetch(self, now: int) -> None:
        self._dataloader = True
        if self._current is None or self._scoped:
            return
        if self._optimized and not self._explicit:
            self._close(now)
        elif self._forwards and not self._backward:
            self._discard()  # forward-only work since the step began: evaluation batches
        # else: another micro-batch of this step (or a batch fetched ahead)

    def _open(self, now: int) -> None:
        self._current = Step(-1, now, now)  # numbered when it closes: discarded ones take none
        self._reset_step()
        if self._on_first_open is not None:
            self._delivered = True
            first, self._on_first_open = self._on_first_open, None
            first(self._next_number)

    def _discard(self) -> None:
        self.eval_forwards += self._nograd
        self._current = None
        self._reset_step()
        self._reset_batches()

    def _cut_phases(self, cut: int) -> list[tuple[tuple[str, int, int], str | None]]:
        """Takes the current step's intervals that began at ``cut`` or later out of it."""
        step = self._current
        assert step is not None
        spans = list(zip(step.phases, step.phase_modules, strict=True))  # kept aligned
        moved = [(p, m) for p, m in spans if p[1] >= cut]
        step.phases = [p for p, _m in spans if p[1] < cut]
        step.phase_modules = [m for p, m in spans if p[1] < cut]
        totals = step.phase_totals_ns
        for (phase, start, end), _m in moved:
            totals[phase] -= end - start
        for phase in PHASES:
            if phase in totals and not step.dropped_phases and all(p != phase for p, _s, _e in step.phases):
                del totals[phase]  # none of its intervals is left
        return moved

    def _split(self) -> None:
        """The optimizer about to step already did in this step: the step ends where its last
        optimizer step ended, and what began since moves to the next step."""
        cut = self._last_opt_end
        moved = self._cut_phases(cut)
        self._pending = 0  # moved along
        self._close(cut)
        self._open(cut)
        for (phase, start, end), module in moved:
            self._interval(phase, start, end, module)
            if phase == "forward":
                self._forwards += 1
            elif phase == "backward":
                self._backward = True

    def _close(self, end: int, number: int | None = None) -> None:
        step, self._current = self._current, None
        if step is None:
            return
        step.end_ns = max(end, step.start_ns)
        if step.evaluation:  # takes the next training step's number, counts its forwards
            step.number = self._next_number
            self.eval_forwards += self._forwards
        else:
            step.number = self._next_number if number is None else number
            self._next_number = step.number + 1
        step.samples = self._samples if self._set_samples is None else self._set_samples
        step.tokens = self._tokens if self._set_tokens is None else self._set_tokens
        step.micro_batches = self._batches if self._set_batches is None else self._set_batches
        step.skipped = self._skipped and not self._updated
        if self._opts:
            self._known = self._opts
        self._kept = self._pending
        self._reset_step()
        self._reset_batches()
        # phases still running (a forward that spans the boundary) continue into the next step
        self._delivered = True
        self._on_step(step)
