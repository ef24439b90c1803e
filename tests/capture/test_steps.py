"""The step rules on scripted activity sequences (a clock we advance by hand)."""

from __future__ import annotations

from otelprof.capture.steps import Step, StepTracker


class Loop:
    def __init__(self) -> None:
        self.now = 0
        self.steps: list[Step] = []
        self.tracker = StepTracker(self.steps.append, clock=lambda: self.now)

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
