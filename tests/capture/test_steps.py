"""The step rules on scripted activity sequences (a clock we advance by hand), for the native
tracker and the Python reference alike; and the two against each other on random sequences."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof._native_module import native as native_module
from otelprof.capture.steps.native_tracker import NativeStepTracker, step_tracker
from otelprof.capture.steps.step import HINT_FORWARDS, HINT_TRAINING_FORWARDS, HOOKS, PHASES, UPDATE_HOOK, Step
from otelprof.capture.steps.tracker import StepTracker

needs_native = pytest.mark.skipif(native_module is None, reason="the native core is not built")
KINDS = [pytest.param(False, id="python"), pytest.param(True, id="native", marks=needs_native)]


@pytest.fixture(params=KINDS, autouse=True)
def native(request: pytest.FixtureRequest) -> bool:
    Loop.native = request.param
    return bool(request.param)


# The native-vs-reference tests below replay both trackers themselves: parametrising ``native``
# directly overrides the autouse fixture above, so they run once instead of twice over the same work.
BOTH = pytest.mark.parametrize("native", [pytest.param(True, id="both")])


class Loop:
    native = False

    def __init__(self) -> None:
        self.now = 0
        self.grad = True
        self.steps: list[Step] = []
        self.hints: list[int] = []
        self.tracker = step_tracker(
            self.steps.append,
            clock=lambda: self.now,
            native=self.native,
            grad_enabled=lambda: self.grad,
            on_hint=self.hints.append,
        )
        assert isinstance(self.tracker, NativeStepTracker if self.native else StepTracker)

    def phase(self, name: str, ns: int = 10, key: int = 0) -> None:
        self.tracker.phase_begin(name, key)
        self.now += ns
        self.tracker.phase_end(name)

    def fetch(self, samples: int | None, tokens: int | None = None, ns: int = 10) -> None:
        self.tracker.begin_data()
        self.now += ns
        self.tracker.data_end(samples, tokens)

    def exhausted(self, ns: int = 10) -> None:
        self.tracker.begin_data()
        self.now += ns
        self.tracker.end_data()

    def idle(self, ns: int = 5) -> None:
        self.now += ns


def _spans(steps: list[Step]) -> list[tuple[int, int, int]]:
    return [(s.number, s.start_ns, s.end_ns) for s in steps]


def test_dataloader_loop_steps_tile_from_fetch_to_fetch() -> None:
    loop = Loop()
    for _ in range(3):
        loop.phase("data")
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer")
        loop.idle()
    loop.phase("data")  # the next epoch's (or the StopIteration) fetch closes the last step
    assert _spans(loop.steps) == [(0, 0, 45), (1, 45, 90), (2, 90, 135)]
    assert loop.steps[0].phases == [("data", 0, 10), ("forward", 10, 20), ("backward", 20, 30), ("optimizer", 30, 40)]
    assert loop.steps[1].phase_totals_ns == {"data": 10, "forward": 10, "backward": 10, "optimizer": 10}


def test_a_boundarys_callbacks_are_no_phases_time() -> None:
    """A window's stop runs in the step callback at the boundary (the next fetch): the data
    phase that opened there restarts after it; the step keeps its boundary (steps tile)."""
    loop = Loop()

    def slow_callback(step: Step) -> None:
        loop.steps.append(step)
        loop.now += 1000  # the profiler's stop

    loop.tracker = step_tracker(slow_callback, clock=lambda: loop.now, native=Loop.native)
    for _ in range(2):
        loop.phase("data")
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer")
    loop.phase("data")
    first, second = loop.steps
    assert (first.start_ns, first.end_ns) == (0, 40)
    assert (second.start_ns, second.end_ns) == (40, 1080)  # tiles: begins at the boundary
    assert second.phases[0] == ("data", 1040, 1050)  # not (40, 1050): the stop is in no phase
    assert second.phase_totals_ns == {"data": 10, "forward": 10, "backward": 10, "optimizer": 10}


def test_forward_phases_name_their_root_module() -> None:
    loop = Loop()
    loop.tracker.begin_data()
    loop.tracker.data_end(4, None)
    for module in (Encoder(), OptimizedModule()):
        loop.tracker.begin_forward(module, ())
        loop.now += 10
        loop.tracker.end_forward(module, (), None)
    loop.tracker.begin_optimizer(None, (), {})
    loop.tracker.end_optimizer(None, (), {})
    loop.tracker.begin_data()
    [step] = loop.steps
    assert [p[0] for p in step.phases] == ["data", "forward", "forward", "optimizer"]
    assert step.phase_modules == [None, "Encoder", "Encoder", None]  # a compiled one: its module's


def test_several_optimizers_in_one_iteration_are_one_step() -> None:
    loop = Loop()
    for _ in range(2):  # a GAN: discriminator then generator, each with its own optimizer
        loop.phase("data")
        for net in range(2):
            loop.phase("forward")
            loop.phase("backward")
            loop.phase("optimizer", key=net)
    loop.phase("data")
    assert _spans(loop.steps) == [(0, 0, 70), (1, 70, 140)]
    assert loop.steps[0].phase_totals_ns["optimizer"] == 20


def test_without_dataloader_back_to_back_optimizers_are_one_step() -> None:
    loop = Loop()
    for _ in range(3):
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer", key=1)
        loop.phase("optimizer", key=2)  # a second optimizer, no work between
        loop.idle()  # zero_grad, logging: the next step's
    loop.tracker.finish()
    assert _spans(loop.steps) == [(0, 0, 40), (1, 40, 85), (2, 85, 130)]
    # the first step ended once optimizer 1 stepped again; the work since moved to step 1
    assert loop.steps[1].phases[0] == ("forward", 45, 55)
    assert loop.steps[0].phase_totals_ns == {"forward": 10, "backward": 10, "optimizer": 20}
    assert loop.steps[1].phase_totals_ns == {"forward": 10, "backward": 10, "optimizer": 20}


def test_gan_without_dataloader_is_one_step_per_iteration() -> None:
    loop = Loop()
    for _ in range(30):  # D: forward, backward, step; G: forward, backward, step
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer", key=1)
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer", key=2)
        loop.idle()
    # the last step closed at G's step, before any shutdown
    assert len(loop.steps) == 30
    loop.tracker.finish()
    assert len(loop.steps) == 30
    assert all(s.phase_totals_ns == {"forward": 20, "backward": 20, "optimizer": 20} for s in loop.steps)
    assert [s.end_ns - s.start_ns for s in loop.steps] == [60] + [65] * 29


def test_an_optimizer_stepping_again_after_a_fetch_is_a_new_update() -> None:
    loop = Loop()
    loop.fetch(8)
    for _ in range(3):  # several updates on one batch (PPO epochs)
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer", key=1)
    loop.exhausted()
    assert [(s.start_ns, s.end_ns, s.samples, s.micro_batches) for s in loop.steps] == [
        (0, 40, 8, 1),
        (40, 70, None, 0),
        (70, 100, None, 0),
    ]


def test_accumulated_micro_batches_are_one_step() -> None:
    loop = Loop()
    for _ in range(2):
        for _micro in range(4):
            loop.fetch(8, 128)
            loop.phase("forward")
            loop.phase("backward")
        loop.phase("optimizer", key=1)
        loop.idle()
    loop.exhausted()
    assert _spans(loop.steps) == [(0, 0, 135), (1, 135, 270)]
    assert [(s.samples, s.tokens, s.micro_batches) for s in loop.steps] == [(32, 512, 4), (32, 512, 4)]
    assert loop.steps[0].phase_totals_ns == {"data": 40, "forward": 40, "backward": 40, "optimizer": 10}
    assert len(loop.steps[0].phases) == 13


def test_batches_fetched_ahead_count_for_the_step() -> None:
    """A window fetched before its forwards (a Trainer taking its accumulation window first) is
    consumed within the step: its batches are the step's. A loader that fetches one batch ahead
    across the update (accelerate's) is counted where it yields, by the hooks (loaders.py), so
    the tracker sees the batches as they are consumed (test_step_libraries.py)."""
    loop = Loop()
    for _ in range(2):
        for _micro in range(4):  # a Trainer fetching the accumulation window first
            loop.fetch(4, 64)
        for _micro in range(4):
            loop.phase("forward")
            loop.phase("backward")
        loop.phase("optimizer")
    loop.exhausted()
    assert [(s.samples, s.tokens, s.micro_batches) for s in loop.steps] == [(16, 256, 4), (16, 256, 4)]


def test_a_closure_pauses_the_optimizer_phase() -> None:
    loop = Loop()
    for _ in range(2):
        loop.fetch(8)
        loop.tracker.phase_begin("optimizer", 1)  # LBFGS / Lightning: step(closure)
        for _evaluation in range(2):
            loop.idle(3)
            loop.phase("forward")
            loop.phase("backward")
        loop.idle(4)
        loop.tracker.phase_end("optimizer")
    loop.exhausted()
    first = loop.steps[0]
    assert first.phase_totals_ns == {"data": 10, "forward": 20, "backward": 20, "optimizer": 10}
    assert [p for p, _s, _e in first.phases] == ["data"] + ["optimizer", "forward", "backward"] * 2 + ["optimizer"]
    ends = [0] + [e for _p, _s, e in first.phases]
    assert all(start >= ends[k] for k, (_p, start, _e) in enumerate(first.phases))  # no overlap
    assert sum(first.phase_totals_ns.values()) <= first.end_ns - first.start_ns


def test_evaluation_forwards_after_an_update_are_charged_to_no_step() -> None:
    loop = Loop()
    for _ in range(2):
        loop.fetch(8)
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer")
        loop.grad = False  # torch.no_grad(): evaluation on held-out tensors, no DataLoader
        for _batch in range(3):
            loop.phase("forward", 100)
        loop.grad = True
    loop.exhausted()
    assert _spans(loop.steps) == [(0, 0, 40), (1, 340, 380)]
    assert all(s.phase_totals_ns["forward"] == 10 for s in loop.steps)
    assert loop.tracker.eval_forwards == 6


def test_evaluation_dataloader_batches_are_dropped_and_counted() -> None:
    loop = Loop()
    loop.fetch(8)
    loop.phase("forward")
    loop.phase("backward")
    loop.phase("optimizer")
    loop.grad = False
    for _ in range(3):
        loop.fetch(100)
        loop.phase("forward")
    loop.exhausted()  # the evaluation DataLoader ends: no step begins there
    loop.grad = True
    loop.idle(1000)
    loop.fetch(8)
    loop.phase("forward")
    loop.phase("backward")
    loop.phase("optimizer")
    loop.exhausted()
    assert _spans(loop.steps) == [(0, 0, 40), (1, 1110, 1150)]
    assert [s.samples for s in loop.steps] == [8, 8]
    assert loop.tracker.eval_forwards == 3


def test_an_exhausted_dataloader_does_not_begin_a_step() -> None:
    loop = Loop()
    for _epoch in range(2):
        loop.fetch(8)
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer")
        loop.exhausted()  # the epoch ends; evaluation, checkpoints: no step's
        loop.idle(500)
    assert _spans(loop.steps) == [(0, 0, 40), (1, 550, 590)]


def test_a_forward_during_backward_is_recomputation() -> None:
    """Activation checkpointing runs the checkpointed forwards again inside backward (on the
    training thread, or on the engine's device threads: the tracker is one for all threads):
    backward's time, no forward phase, no forward pass (no hint, no evaluation), whatever the
    grad mode the engine runs them under."""
    loop = Loop()
    for _ in range(12):
        loop.fetch(4)
        loop.phase("forward")
        loop.tracker.phase_begin("backward")
        for layer in range(3):
            loop.idle(2)
            loop.grad = layer != 1
            loop.phase("forward", 5)
            loop.grad = True
        loop.idle(2)
        loop.tracker.phase_end("backward")
        loop.phase("optimizer")
    loop.exhausted()
    assert len(loop.steps) == 12 and loop.tracker.eval_forwards == 0
    for step in loop.steps:
        assert [p for p, _s, _e in step.phases] == ["data", "forward", "backward", "optimizer"]
        assert step.phase_totals_ns == {"data": 10, "forward": 10, "backward": 23, "optimizer": 10}


def test_recomputation_is_no_forward_pass_for_the_hint() -> None:
    """16 micro-batches accumulated (each recomputed in backward) before the first update: no
    hint that nothing marks steps; a loop that never updates hears it once."""
    loop = Loop()
    for _micro in range(16):
        loop.fetch(2)
        loop.phase("forward")
        loop.tracker.phase_begin("backward")
        loop.phase("forward")  # recomputed
        loop.tracker.phase_end("backward")
    loop.phase("optimizer")
    loop.exhausted()
    assert loop.hints == [] and [s.micro_batches for s in loop.steps] == [16]
    never = Loop()
    for _ in range(HINT_TRAINING_FORWARDS + 5):
        never.phase("forward")
        never.phase("backward")
    assert never.hints == [HINT_TRAINING_FORWARDS] and never.steps == []
    inference = Loop()
    for _ in range(HINT_FORWARDS + 5):
        inference.phase("forward")
    assert inference.hints == [HINT_FORWARDS]


def _scaled_update(loop: Loop, opt: object, skipped: bool) -> None:
    """GradScaler.step(opt): the hooks open the optimizer phase; opt.step() runs inside unless
    the gradients had inf/NaN."""
    tracker: Any = loop.tracker
    tracker.begin_optimizer(opt, (), {})
    loop.idle(3)  # unscale, the inf check
    if not skipped:
        tracker.begin_optimizer(opt, (), {})
        loop.idle(10)
        tracker.end_optimizer(opt, (), {})
    tracker.end_update()


def test_a_skipped_update_is_a_step_that_says_so() -> None:
    """A GradScaler update that found inf gradients (no optimizer.step()) still ends the step:
    its micro-batch is its own, and it is marked skipped."""
    loop = Loop()
    opt = object()
    skipped = [False, True, False, False, True, True, False]
    for skip in skipped:
        loop.fetch(4, 32)
        loop.phase("forward")
        loop.phase("backward")
        _scaled_update(loop, opt, skip)
        loop.idle()
    loop.exhausted()
    assert [s.skipped for s in loop.steps] == skipped
    assert [(s.samples, s.tokens, s.micro_batches) for s in loop.steps] == [(4, 32, 1)] * len(skipped)
    assert [s.phase_totals_ns["optimizer"] for s in loop.steps] == [3 if k else 13 for k in skipped]
    assert all([p for p, _s, _e in s.phases] == ["data", "forward", "backward", "optimizer"] for s in loop.steps)


def test_skipped_updates_without_a_dataloader_and_with_explicit_steps() -> None:
    loop = Loop()
    opt = object()
    for skip in (False, True, True, False):  # no DataLoader: the update (skipped or not) ends the step
        loop.phase("forward")
        loop.phase("backward")
        _scaled_update(loop, opt, skip)
        loop.idle()
    loop.tracker.finish()
    assert [s.skipped for s in loop.steps] == [False, True, True, False]
    explicit = Loop()
    for skip in (True, False):
        explicit.fetch(4)
        explicit.phase("forward")
        explicit.phase("backward")
        _scaled_update(explicit, opt, skip)
        explicit.tracker.step()  # a framework callback after the update
    assert [s.skipped for s in explicit.steps] == [True, False]


def test_no_grad_forwards_after_the_update_are_the_steps_own() -> None:
    """An EMA teacher's forward under no_grad after the update, before the next fetch, is work
    of the step; evaluation on held-out tensors (more no-grad forwards than the step usually
    has) is not, the teacher's forward before it staying the step's."""
    loop = Loop()
    for i in range(6):
        loop.fetch(4)
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer")
        loop.grad = False
        loop.idle(3)
        loop.phase("forward", 7)  # the teacher
        if i % 3 == 2:  # evaluation every 3 updates: 3 batches of held-out tensors
            for _batch in range(3):
                loop.idle(4)
                loop.phase("forward", 100)
        loop.grad = True
    loop.exhausted()
    assert loop.tracker.eval_forwards == 2 * 3
    assert len(loop.steps) == 6
    for i, step in enumerate(loop.steps):
        assert [p for p, _s, _e in step.phases] == ["data", "forward", "backward", "optimizer", "forward"]
        assert step.phase_totals_ns["forward"] == 17
        if i % 3 == 2:  # it ends where the evaluation began
            assert step.end_ns == step.phases[-1][2] + 4
    # evaluation at the end, without a DataLoader: its forwards, not the last teacher's
    end = Loop()
    end.fetch(4)
    end.phase("forward")
    end.phase("backward")
    end.phase("optimizer")
    end.grad = False
    end.phase("forward")  # the teacher
    end.tracker.finish()
    assert end.tracker.eval_forwards == 1  # at shutdown, no-grad forwards after the update are evaluation
    assert [p for p, _s, _e in end.steps[0].phases] == ["data", "forward", "backward", "optimizer"]


def test_a_scope_takes_the_batch_fetched_before_it() -> None:
    """``for x in loader: with otelprof.step_scope("infer"): model(x)``: the fetch happens just
    before the scope opens; the scope's step has its samples, tokens and micro-batch."""
    loop = Loop()
    loop.grad = False
    for size in (4, 4, 3):
        loop.fetch(size, size * 8)
        loop.tracker.begin_scope("infer")
        loop.phase("forward")
        loop.tracker.end_scope()
    loop.exhausted()
    assert [(s.name, s.samples, s.tokens, s.micro_batches) for s in loop.steps] == [
        ("infer", 4, 32, 1),
        ("infer", 4, 32, 1),
        ("infer", 3, 24, 1),
    ]
    assert loop.tracker.eval_forwards == 0


def test_explicit_steps_sum_their_fetches_and_take_the_frameworks_numbers() -> None:
    loop = Loop()
    for update in range(2):
        for _micro in range(2):
            loop.fetch(4, 40)
            loop.phase("forward")
            loop.phase("backward")
        loop.phase("optimizer")
        loop.idle()
        loop.tracker.step(number=100 + update)  # a framework callback: its global step
        loop.idle(50)  # logging, checkpointing: no step's
    loop.fetch(4)
    loop.phase("forward")
    loop.tracker.step(samples=3)  # the framework knows the real count
    assert [(s.number, s.start_ns, s.end_ns, s.samples, s.tokens, s.micro_batches) for s in loop.steps] == [
        (100, 0, 75, 8, 80, 2),
        (101, 125, 200, 8, 80, 2),
        (102, 250, 270, 3, None, 1),
    ]
    loop.tracker.step()  # nothing since the last boundary: the step spans from it
    assert _spans(loop.steps[3:]) == [(103, 270, 270)]


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_native)], ids=["python", "native"])
def test_explicit_micro_batches_replace_the_fetch_count(native: bool) -> None:
    """A framework that fetches a batch ahead (accelerate, Lightning) or splits one fetched batch
    (Composer) gives its own count; a step without one counts its fetches."""
    out: list[Step] = []
    tracker: Any = step_tracker(out.append, clock=lambda: 0, native=native)
    for fetches, count in ((2, 1), (1, None), (1, 4), (0, 0)):
        for _ in range(fetches):
            tracker.begin_data(None, ())
            tracker.data_end(4, None)
        tracker.step(micro_batches=count)
    assert [(s.micro_batches, s.samples) for s in out] == [(1, 8), (1, 4), (4, 4), (0, None)]
    with pytest.raises(ValueError, match="micro-batch count"):
        tracker.step(micro_batches=-1)


def test_explicit_steps_leave_evaluation_out() -> None:
    loop = Loop()
    loop.fetch(4)
    loop.phase("forward")
    loop.phase("backward")
    loop.phase("optimizer")
    loop.tracker.step()
    loop.grad = False
    loop.fetch(50)  # an evaluation DataLoader between updates
    loop.phase("forward")
    loop.fetch(50)
    loop.phase("forward")
    loop.phase("forward")  # ... and one without
    loop.grad = True
    loop.fetch(4)
    loop.phase("forward")
    loop.phase("backward")
    loop.phase("optimizer")
    loop.tracker.step()
    assert [(s.start_ns, s.samples, s.micro_batches) for s in loop.steps] == [(0, 4, 1), (90, 4, 1)]
    assert loop.tracker.eval_forwards == 3  # each in work a fetch dropped
    assert "forward" in loop.steps[1].phase_totals_ns


def test_a_loop_with_no_step_hints_once() -> None:
    loop = Loop()
    for _ in range(30):
        loop.phase("forward")
    assert loop.hints == [10] and loop.steps == []
    loop.tracker.finish()
    assert loop.steps == []


def test_no_hint_when_steps_are_marked() -> None:
    loop = Loop()
    for _ in range(30):
        loop.phase("forward")
        loop.tracker.step()
    assert loop.hints == [] and len(loop.steps) == 30


def test_set_batch_after_the_update_goes_to_the_next_step() -> None:
    loop = Loop()
    for size in (8, 4):
        loop.tracker.set_batch(samples=size)
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer", key=1)
    loop.tracker.finish()
    assert [s.samples for s in loop.steps] == [8, 4]


def test_bad_explicit_values_raise() -> None:
    loop = Loop()
    with pytest.raises(ValueError, match="step number"):
        loop.tracker.step(number=-1)
    with pytest.raises(ValueError, match="batch size"):
        loop.tracker.set_batch(samples=-3)
    assert not loop.tracker.failed


def test_evaluation_between_epochs_is_not_a_step() -> None:
    loop = Loop()
    loop.phase("data")
    loop.phase("forward")
    loop.phase("backward")
    loop.phase("optimizer")
    for _ in range(3):  # an evaluation DataLoader: forward only
        loop.phase("data")
        loop.phase("forward")
    loop.phase("data")  # training resumes
    loop.phase("forward")
    loop.phase("backward")
    loop.phase("optimizer")
    loop.phase("data")
    assert _spans(loop.steps) == [(0, 0, 40), (1, 100, 140)]


def test_explicit_steps_and_scopes() -> None:
    loop = Loop()
    loop.phase("forward")
    loop.tracker.step()
    loop.phase("forward")
    loop.phase("optimizer")  # automatic rules are off now
    loop.tracker.step()
    loop.tracker.begin_scope("inference")
    loop.idle(7)
    loop.tracker.end_scope()
    assert _spans(loop.steps) == [(0, 0, 10), (1, 10, 30), (2, 30, 37)]
    assert loop.steps[2].name == "inference"


class _NativeLoop(Loop):
    native = True


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_native)], ids=["python", "native"])
def test_an_evaluation_scope_is_no_training_step(native: bool) -> None:
    """A framework's evaluation between updates: its own span (the next step's number, its
    forwards counted as evaluation), the training steps numbered on as if it were not there."""
    loop = _NativeLoop() if native else Loop()
    loop.fetch(4)
    loop.phase("forward")
    loop.phase("backward")
    loop.phase("optimizer")
    loop.tracker.step(number=0)
    loop.tracker.begin_scope("evaluation", evaluation=True)
    loop.grad = False
    for _ in range(2):
        loop.fetch(8)
        loop.phase("forward")
    loop.grad = True
    loop.tracker.end_scope()
    loop.fetch(4)
    loop.phase("forward")
    loop.phase("backward")
    loop.phase("optimizer")
    loop.tracker.step()
    assert [(s.name, s.number, s.evaluation, s.samples) for s in loop.steps] == [
        ("train.step", 0, False, 4),
        ("evaluation", 1, True, 16),
        ("train.step", 1, False, 4),
    ]
    assert "forward" in loop.steps[1].phase_totals_ns
    assert loop.tracker.eval_forwards == 2


def test_batch_size_goes_to_the_step_it_was_fetched_for() -> None:
    loop = Loop()
    for size in (8, 4):
        loop.phase("data")
        loop.tracker.set_batch(samples=size, tokens=size * 16)
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer")
    loop.phase("data")
    assert [(s.samples, s.tokens) for s in loop.steps] == [(8, 128), (4, 64)]


def test_the_hooks_take_what_torch_passes_and_return_none() -> None:
    loop = Loop()
    tracker: Any = loop.tracker
    module, batch, opt = object(), (1, 2), object()
    assert tracker.begin_data() is None
    assert tracker.data_end(4, None) is None
    assert tracker.begin_forward(module, batch) is None  # a forward pre-hook: (module, args)
    loop.idle()
    assert tracker.end_forward(module, batch, "output") is None
    assert tracker.begin_backward() is None
    assert tracker.end_backward() is None
    assert tracker.begin_optimizer(opt, (), {}) is None  # optimizer hooks: (optimizer, args, kwargs)
    assert tracker.end_optimizer(opt, (), {}) is None
    assert tracker.begin_data() is None
    tracker.end_data()
    [step] = loop.steps
    assert [p for p, _s, _e in step.phases] == ["data", "forward", "backward", "optimizer"]
    assert step.phase_totals_ns["forward"] == 5 and step.samples == 4 and step.tokens is None


def test_a_failing_callback_stops_the_tracker_and_is_reported_once() -> None:
    errors: list[BaseException] = []

    def on_step(step: Step) -> None:
        raise RuntimeError(f"broken at step {step.number}")

    tracker: Any = step_tracker(on_step, on_error=errors.append, native=Loop.native)
    for _ in range(3):
        tracker.begin_forward(None, ())
        tracker.end_forward(None, (), None)
        tracker.begin_optimizer(None, (), {})
        tracker.end_optimizer(None, (), {})  # the step ends at the next forward: on_step raises
    assert tracker.failed
    assert [str(e) for e in errors] == ["broken at step 0"]
    assert isinstance(errors[0], RuntimeError) and errors[0].__traceback__ is not None


def test_a_failing_clock_stops_the_tracker() -> None:
    errors: list[BaseException] = []

    def clock() -> int:
        raise OSError("no clock")

    tracker: Any = step_tracker(lambda s: None, clock=clock, on_error=errors.append, native=Loop.native)
    tracker.begin_forward(None, ())
    tracker.begin_optimizer(None, (), {})
    assert tracker.failed and [type(e) for e in errors] == [OSError]


def test_an_odd_batch_size_leaves_the_size_unknown() -> None:
    loop = Loop()
    tracker: Any = loop.tracker
    tracker.begin_data()
    if Loop.native:
        tracker.data_end("eight", 2**80)  # C: neither is a usable size
    else:
        tracker.data_end(None, None)
    loop.phase("forward")
    loop.phase("optimizer")
    loop.phase("data")
    assert not tracker.failed
    assert [(s.samples, s.tokens) for s in loop.steps] == [(None, None)]


def test_the_default_clock_is_wall_time() -> None:
    steps: list[Step] = []
    tracker: Any = step_tracker(steps.append, native=Loop.native)
    before = time.time_ns()
    tracker.begin_forward(None, ())
    tracker.end_forward(None, (), None)
    tracker.step()
    after = time.time_ns()
    [step] = steps
    assert before <= step.start_ns <= step.phases[0][1] <= step.phases[0][2] <= step.end_ns <= after


def test_close_lets_the_session_go() -> None:
    class Owner:
        def on_step(self, step: Step) -> None:
            pass

    owner = Owner()
    tracker: Any = step_tracker(owner.on_step, native=Loop.native)
    owner.tracker = tracker  # type: ignore[attr-defined]  # the session's cycle
    hook = tracker.begin_forward
    ref = weakref.ref(owner)
    tracker.finish()
    tracker.close()
    del owner, tracker
    gc.collect()
    assert ref() is None
    hook(None, ())  # a hook torch still holds is harmless


# --- the native tracker against the Python reference ---------------------------------------

_SIZE = st.none() | st.integers(0, 64)
_SIZES = st.tuples(_SIZE, st.none() | st.integers(0, 4096))
#: Optimizers the hooks tell apart by identity (the same objects for both trackers).
_OPTIMIZERS = [object(), object(), None]


class Encoder:
    pass


class OptimizedModule:  # as torch.compile's wrapper: named after the module it wraps
    def __init__(self) -> None:
        self._orig_mod = Encoder()


#: Root modules a forward hook gets (their class names go on the forward phases).
_MODULES = [Encoder(), OptimizedModule(), None]
#: What hooks report: with these alone the automatic rules decide every boundary.
_AUTOMATIC = st.one_of(
    st.tuples(st.sampled_from(["begin", "end"]), st.sampled_from(PHASES)),
    st.tuples(st.just("begin_forward"), st.integers(0, len(_MODULES) - 1)),
    st.tuples(st.just("begin_optimizer"), st.integers(0, len(_OPTIMIZERS) - 1)),
    st.tuples(st.sampled_from(["data_end", "set_batch"]), _SIZES),
    st.tuples(st.sampled_from(["end_data", "end_update"]), st.none()),
    st.tuples(st.just("grad"), st.booleans()),
    st.tuples(st.just("tick"), st.integers(0, 50)),
)
#: What the application may call besides (the first of these turns the automatic rules off).
_EXPLICIT = st.one_of(
    st.tuples(st.sampled_from(["end_scope", "finish"]), st.none()),
    st.tuples(st.just("step"), st.tuples(st.none() | st.integers(0, 1000), _SIZE, _SIZE, _SIZE)),
    st.tuples(st.just("begin_scope"), st.tuples(st.sampled_from(["infer", "eval", "x\ud800"]), st.booleans())),
)


def _replay(
    native: bool, events: list[tuple[str, Any]], callback_ns: int = 0
) -> tuple[list[tuple[Any, ...]], list[int], list[int], int]:
    """``callback_ns``: the time each callback takes (a profiling window's stop at a boundary)."""
    now = [1_000]
    grad = [True]
    out: list[Step] = []
    opened: list[int] = []
    hints: list[int] = []

    def taking_time(append: Callable[[Any], None]) -> Callable[[Any], None]:
        def callback(value: Any) -> None:
            append(value)
            now[0] += callback_ns

        return callback

    tracker: Any = step_tracker(
        taking_time(out.append),
        clock=lambda: now[0],
        on_first_open=taking_time(opened.append),
        native=native,
        grad_enabled=lambda: grad[0],
        on_hint=taking_time(hints.append),
    )
    for kind, arg in events:
        if kind == "tick":
            now[0] += arg
        elif kind == "grad":
            grad[0] = arg
        elif kind in ("begin", "end"):
            getattr(tracker, f"{kind}_{arg}")(None, ())
        elif kind == "begin_optimizer":
            tracker.begin_optimizer(_OPTIMIZERS[arg], (), {})
        elif kind == "begin_forward":
            tracker.begin_forward(_MODULES[arg], ())
        elif kind == "data_end":
            tracker.data_end(*arg)
        elif kind == "end_data":
            tracker.end_data()
        elif kind == "set_batch":
            tracker.set_batch(*arg)
        elif kind == "step":
            number, samples, tokens, micro_batches = arg
            tracker.step(number=number, samples=samples, tokens=tokens, micro_batches=micro_batches)
        elif kind == "begin_scope":
            tracker.begin_scope(*arg)
        else:
            getattr(tracker, kind)()
    assert not tracker.failed
    fields = [
        (
            s.number,
            s.start_ns,
            s.end_ns,
            s.phases,
            s.phase_totals_ns,
            s.dropped_phases,
            s.samples,
            s.tokens,
            s.name,
            s.micro_batches,
            s.evaluation,
            s.phase_modules,
            s.skipped,
        )
        for s in out
    ]
    return fields, opened, hints, tracker.eval_forwards


@needs_native
@BOTH
@settings(max_examples=400, deadline=None)
@given(st.lists(_AUTOMATIC, max_size=120), st.lists(_AUTOMATIC | _EXPLICIT, max_size=60), st.sampled_from([0, 3]))
def test_native_tracker_equals_the_python_reference(
    native: bool, automatic: list[tuple[str, Any]], mixed: list[tuple[str, Any]], callback_ns: int
) -> None:
    events = automatic + mixed + [("finish", None)]
    assert _replay(True, events, callback_ns) == _replay(False, events, callback_ns)


@needs_native
@BOTH
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                ("begin", "forward"),
                ("end", "forward"),
                ("begin", "backward"),
                ("end", "backward"),
                ("begin_optimizer", 0),
                ("begin_optimizer", 1),
                ("end", "optimizer"),
                ("end_update", None),
                ("data_end", (4, 64)),
                ("begin", "data"),
                ("end_data", None),
                ("grad", False),
                ("grad", True),
                ("tick", 7),
            ]
        ),
        max_size=200,
    )
)
def test_native_tracker_equals_the_python_reference_on_loop_like_activity(
    native: bool, events: list[tuple[str, Any]]
) -> None:
    """Denser in the events that decide boundaries (optimizers, fetches, grad mode)."""
    events = [*events, ("finish", None)]
    assert _replay(True, events) == _replay(False, events)


@needs_native
@BOTH
def test_native_tracker_keeps_64_phases_and_counts_the_rest(native: bool) -> None:
    events: list[tuple[str, Any]] = [("begin", "data"), ("data_end", (None, None))]
    events += [("begin", "forward"), ("tick", 1), ("end", "forward")] * 70
    events += [("begin", "optimizer"), ("end", "optimizer"), ("begin", "data")]
    from_native, opened, _hints, _evals = _replay(True, events)
    assert from_native == _replay(False, events)[0] and opened == [0]
    [step] = from_native
    assert len(step[3]) == 64 and step[5] == 70 + 2 - 64 and step[4]["forward"] == 70


def test_every_hook_exists() -> None:
    tracker = Loop().tracker
    for name in (*HOOKS, UPDATE_HOOK):
        assert callable(getattr(tracker, name))
