"""CUDA-event step timing on scripted timelines: a CPU that runs ahead of a GPU, with events
that complete when the simulated device reaches them (CI has no GPU; benchmarks/gpu_check.py
runs the real thing on a GPU machine)."""

from __future__ import annotations

from otelprof.capture.steps.device_timing import MAX_PENDING, DeviceTiming
from otelprof.capture.steps.step import Step
from otelprof.capture.steps.tracker import StepTracker


class Device:
    """A stream: work queued by the CPU finishes in order; ``done_ns`` is how far it has got."""

    def __init__(self) -> None:
        self.queued_ns = 0  # device time at the end of the work queued so far
        self.done_ns = 0


class FakeEvent:
    def __init__(self, device: Device) -> None:
        self.device = device
        self.at_ns = -1
        self.synchronized = 0

    def record(self) -> None:
        self.at_ns = self.device.queued_ns

    def query(self) -> bool:
        return self.device.done_ns >= self.at_ns

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time on an event that has not completed"
        return (end.at_ns - self.at_ns) / 1e6

    def synchronize(self) -> None:
        self.synchronized += 1
        self.device.done_ns = max(self.device.done_ns, self.at_ns)


class Loop:
    """The CPU launches each phase in 1 ns of wall time; the GPU needs ``gpu_ns`` for it."""

    def __init__(self, active: bool = True) -> None:
        self.wall = 1_000
        self.device = Device()
        self.active = active
        self.steps: list[Step] = []
        self.timing = DeviceTiming(
            lambda step, ctx: self.steps.append(step), lambda: FakeEvent(self.device), lambda: self.active, self.clock
        )
        self.tracker = StepTracker(lambda step: self.timing.add(step, None), clock=self.timing.clock)

    def clock(self) -> int:
        self.wall += 1
        return self.wall

    def phase(self, name: str, gpu_ns: int) -> None:
        self.tracker.phase_begin(name)
        self.device.queued_ns += gpu_ns
        self.tracker.phase_end(name)

    def iteration(self) -> None:
        self.phase("data", 0)
        self.phase("forward", 100)
        self.phase("backward", 200)
        self.phase("optimizer", 50)


def test_steps_wait_for_the_device_and_get_its_durations() -> None:
    loop = Loop()
    for _ in range(3):
        loop.iteration()
    loop.phase("data", 0)  # closes step 2
    assert loop.steps == []  # the CPU is ahead: nothing has run on the device yet
    loop.device.done_ns = 350  # the device finished step 0's work
    loop.timing.drain()
    assert [s.number for s in loop.steps] == [0]
    step = loop.steps[0]
    assert step.end_ns - step.start_ns == 350  # device time, not the CPU's few nanoseconds
    assert step.phase_totals_ns == {"data": 0, "forward": 100, "backward": 200, "optimizer": 50}
    assert [(p, s - step.start_ns, e - step.start_ns) for p, s, e in step.phases] == [
        ("data", 0, 0),
        ("forward", 0, 100),
        ("backward", 100, 300),
        ("optimizer", 300, 350),
    ]
    loop.device.done_ns = 10_000
    loop.iteration()
    loop.phase("data", 0)  # the next step boundary drains the rest, in order
    assert [s.number for s in loop.steps] == [0, 1, 2, 3]
    assert all(s.end_ns - s.start_ns == 350 for s in loop.steps)
    assert loop.steps[1].start_ns > loop.steps[0].start_ns  # anchored at their CPU starts


def test_shutdown_waits_for_the_last_steps() -> None:
    loop = Loop()
    loop.iteration()
    loop.phase("data", 0)
    loop.tracker.finish()
    assert loop.steps == []
    loop.timing.drain(wait=True)
    assert [s.end_ns - s.start_ns for s in loop.steps] == [350]


def test_without_cuda_initialised_steps_keep_cpu_times_at_once() -> None:
    loop = Loop(active=False)
    loop.iteration()
    loop.phase("data", 0)
    assert len(loop.steps) == 1 and loop.steps[0].end_ns - loop.steps[0].start_ns == 8  # 8 clock ticks
    assert loop.timing.cpu_fallbacks == 1


def test_a_device_far_behind_reports_the_oldest_with_cpu_times() -> None:
    loop = Loop()
    for _ in range(MAX_PENDING + 3):
        loop.iteration()
    assert len(loop.steps) == 2 and loop.timing.cpu_fallbacks == 2  # nothing ran on the device yet
    assert [s.number for s in loop.steps] == [0, 1]
    loop.device.done_ns = 10**9
    loop.timing.drain()
    assert [s.number for s in loop.steps] == list(range(MAX_PENDING + 2))
    assert all(s.end_ns - s.start_ns == 350 for s in loop.steps[2:])


def test_nested_module_calls_take_no_events() -> None:
    loop = Loop()
    events_before = len(loop.timing._events)
    loop.tracker.phase_begin("forward")
    for _ in range(100):  # submodules' forwards inside the model's
        loop.tracker.phase_begin("forward")
        loop.tracker.phase_end("forward")
    loop.tracker.phase_end("forward")
    assert len(loop.timing._events) - events_before == 2
