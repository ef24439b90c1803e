"""The slow-step (anomaly) rule of profiling windows: steps inside a window and the one after it
are marked and neither feed the rolling median nor start a window."""

from __future__ import annotations

import pytest

from otelprof.capture.windows.profiling import Anomaly

pytest.importorskip("torch")

# A run of 25 ms steps (an HF Trainer step here): a window warms up (1 step), records 2 steps
# (the profiler slows them), and the step after pays the profiler's stop (118 ms).
STEADY = [0.025, 0.026, 0.024, 0.025, 0.027, 0.025, 0.024, 0.026, 0.025, 0.025, 0.026, 0.024]
WINDOW = [(0.031, True), (0.044, True), (0.047, True), (0.118, True)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _feed(anomaly: Anomaly, steps: list[tuple[float, bool]], clock: Clock) -> list[int]:
    fired = []
    for k, (seconds, marked) in enumerate(steps):
        clock.now += seconds
        if anomaly.observe(seconds, marked):
            fired.append(k)
    return fired


def test_marked_steps_neither_trigger_nor_enter_the_median() -> None:
    clock = Clock()
    anomaly = Anomaly(factor=3.0, cooldown_s=600, clock=clock)
    steps = [(s, False) for s in STEADY] + WINDOW + [(s, False) for s in STEADY]
    assert _feed(anomaly, steps, clock) == []
    assert anomaly.skipped == len(WINDOW)
    assert list(anomaly.history) == STEADY + STEADY  # only the unmarked steps


def test_the_same_slow_step_unmarked_triggers_once_per_cooldown() -> None:
    clock = Clock()
    anomaly = Anomaly(factor=3.0, cooldown_s=600, clock=clock)
    slow = [(0.118, False)]
    steps = [(s, False) for s in STEADY] + slow + [(s, False) for s in STEADY] + slow
    assert _feed(anomaly, steps, clock) == [len(STEADY)]  # the second is within the cooldown
    clock.now += 600
    assert anomaly.observe(0.118) is True


def test_no_verdict_before_ten_unmarked_steps() -> None:
    clock = Clock()
    anomaly = Anomaly(factor=3.0, cooldown_s=0, clock=clock)
    steps = [(s, False) for s in STEADY[:9]] + WINDOW + [(1.0, False)]
    assert _feed(anomaly, steps, clock) == []  # nine unmarked steps: too few for a median
    assert anomaly.observe(1.0) is True  # ten now


def test_off_with_factor_zero() -> None:
    clock = Clock()
    anomaly = Anomaly(factor=0.0, cooldown_s=0, clock=clock)
    assert _feed(anomaly, [(s, False) for s in STEADY] + [(9.0, False)], clock) == []
