"""The step rules on scripted activity sequences (a clock we advance by hand), for the native
tracker and the Python reference alike; and the two against each other on random sequences."""

from __future__ import annotations

import gc
import time
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.capture import steps as steps_module
from otelprof.capture.steps import HOOKS, PHASES, NativeStepTracker, Step, StepTracker, step_tracker

needs_native = pytest.mark.skipif(steps_module._native is None, reason="the native core is not built")
KINDS = [pytest.param(False, id="python"), pytest.param(True, id="native", marks=needs_native)]


@pytest.fixture(params=KINDS, autouse=True)
def native(request: pytest.FixtureRequest) -> bool:
    Loop.native = request.param
    return bool(request.param)


class Loop:
    native = False

    def __init__(self) -> None:
        self.now = 0
        self.steps: list[Step] = []
        self.tracker = step_tracker(self.steps.append, clock=lambda: self.now, native=self.native)
        assert isinstance(self.tracker, NativeStepTracker if self.native else StepTracker)

    def phase(self, name: str, ns: int = 10) -> None:
        self.tracker.phase_begin(name)
        self.now += ns
        self.tracker.phase_end(name)

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


def test_several_optimizers_in_one_iteration_are_one_step() -> None:
    loop = Loop()
    for _ in range(2):  # a GAN: discriminator then generator, each with its own optimizer
        loop.phase("data")
        for _net in range(2):
            loop.phase("forward")
            loop.phase("backward")
            loop.phase("optimizer")
    loop.phase("data")
    assert _spans(loop.steps) == [(0, 0, 70), (1, 70, 140)]
    assert loop.steps[0].phase_totals_ns["optimizer"] == 20


def test_without_dataloader_back_to_back_optimizers_are_one_step() -> None:
    loop = Loop()
    for _ in range(3):
        loop.phase("forward")
        loop.phase("backward")
        loop.phase("optimizer")
        loop.phase("optimizer")  # a second optimizer, no work between
        loop.idle()  # zero_grad, logging: the next step's
    loop.tracker.finish()
    assert _spans(loop.steps) == [(0, 0, 40), (1, 40, 85), (2, 85, 130)]


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

_SIZES = st.tuples(st.none() | st.integers(0, 64), st.none() | st.integers(0, 4096))
#: What hooks report: with these alone the automatic rules decide every boundary.
_AUTOMATIC = st.one_of(
    st.tuples(st.sampled_from(["begin", "end"]), st.sampled_from(PHASES)),
    st.tuples(st.sampled_from(["data_end", "set_batch"]), _SIZES),
    st.tuples(st.just("tick"), st.integers(0, 50)),
)
#: What the application may call besides (the first of these turns the automatic rules off).
_EXPLICIT = st.one_of(
    st.tuples(st.sampled_from(["step", "end_scope", "finish"]), st.none()),
    st.tuples(st.just("begin_scope"), st.sampled_from(["infer", "eval", "x\ud800"])),
)


def _replay(native: bool, events: list[tuple[str, Any]]) -> tuple[list[tuple[Any, ...]], list[int]]:
    now = [1_000]
    out: list[Step] = []
    opened: list[int] = []
    tracker: Any = step_tracker(out.append, clock=lambda: now[0], on_first_open=opened.append, native=native)
    for kind, arg in events:
        if kind == "tick":
            now[0] += arg
        elif kind in ("begin", "end"):
            getattr(tracker, f"{kind}_{arg}")(None, ())
        elif kind == "data_end":
            tracker.data_end(*arg)
        elif kind == "set_batch":
            tracker.set_batch(*arg)
        elif kind == "begin_scope":
            tracker.begin_scope(arg)
        else:
            getattr(tracker, kind)()
    assert not tracker.failed
    fields = [
        (s.number, s.start_ns, s.end_ns, s.phases, s.phase_totals_ns, s.dropped_phases, s.samples, s.tokens, s.name)
        for s in out
    ]
    return fields, opened


@needs_native
@settings(max_examples=400, deadline=None)
@given(st.lists(_AUTOMATIC, max_size=120), st.lists(_AUTOMATIC | _EXPLICIT, max_size=60))
def test_native_tracker_equals_the_python_reference(
    automatic: list[tuple[str, Any]], mixed: list[tuple[str, Any]]
) -> None:
    events = automatic + mixed + [("finish", None)]
    assert _replay(True, events) == _replay(False, events)


@needs_native
def test_native_tracker_keeps_64_phases_and_counts_the_rest() -> None:
    events: list[tuple[str, Any]] = [("begin", "data"), ("end", "data")]
    events += [("begin", "forward"), ("tick", 1), ("end", "forward")] * 70
    events += [("begin", "optimizer"), ("end", "optimizer"), ("begin", "data")]
    native, opened = _replay(True, events)
    assert native == _replay(False, events)[0] and opened == [0]
    [step] = native
    assert len(step[3]) == 64 and step[5] == 70 + 2 - 64 and step[4]["forward"] == 70


def test_every_hook_exists() -> None:
    tracker = Loop().tracker
    for name in HOOKS:
        assert callable(getattr(tracker, name))
