"""Native steps end to end: the C++ tracker folding steps into the native StepSink's metrics and
span queue gives the same exposition (StepMetrics, itself checked against prometheus-client in
test_step_metrics.py) and the same request bytes (the Python fallback: the reference encoder,
the official classes) as the Python path fed the same activity; CUDA-timed steps too (held in
the sink until stand-in CUDA events complete, then released with the device's times)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from converter_helpers import native_module
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from otelprof.capture.distributed.identity import Identity
from otelprof.capture.metrics.step_metrics import StepMetrics
from otelprof.capture.spans.step_spans import StepContext, StepRecordEncoder, native_sink, record
from otelprof.capture.steps.device_timing import DeviceTiming
from otelprof.capture.steps.native_tracker import step_tracker
from otelprof.capture.steps.step import PHASES, Step
from otelprof.otlp.spans import Attrs

from .test_step_metrics import IDENTITY, exposition

native = native_module()

RESOURCE: Attrs = [("service.name", "svc"), ("otelprof.distributed.rank", 3)]
PARENT = (b"\x11" * 16, b"\x22" * 8)
OPTIMIZERS = [object(), object()]


class Model:
    pass


#: Root modules forward hooks get (None: the explicit API's phase_begin).
MODULES = [Model(), CollectorRegistry(), None]
#: Profiling-window marks, as the session's boundary callback gives them for the next step.
MARKS = [None, "recorded:schedule", "warmup:early", "after"]


def _event() -> Any:
    """One event of a loop's activity: a hook event, batch sizes, a clock tick, a scope, or
    whether the application's span is current when the next step closes."""
    return st.one_of(
        st.tuples(st.sampled_from(["begin", "end"]), st.sampled_from(PHASES)),
        st.tuples(st.just("data_end"), st.tuples(st.none() | st.integers(0, 64), st.none() | st.integers(0, 999))),
        st.tuples(st.just("tick"), st.integers(0, 3 * 10**9)),
        st.tuples(st.just("nested"), st.booleans()),
        st.tuples(st.just("scope"), st.tuples(st.sampled_from(["infer", "x\udcff"]), st.booleans())),
        st.tuples(st.just("begin_optimizer"), st.integers(0, 1)),
        st.tuples(st.just("begin_forward"), st.integers(0, 2)),
        st.tuples(st.just("end_data"), st.none()),
        st.tuples(st.just("grad"), st.booleans()),
        st.tuples(st.just("step"), st.tuples(st.none() | st.integers(0, 99), st.none() | st.integers(0, 9))),
    )


def _events() -> Any:
    """A loop's activity."""
    return st.lists(_event(), max_size=150)


def _drive(
    tracker: Any,
    events: list[tuple[str, Any]],
    now: list[int],
    nested: list[bool],
    grad: list[bool],
    device: _Device | None = None,
) -> None:
    for kind, arg in events:
        if kind in ("gpu", "cuda"):  # the device's progress; CUDA initialised or not
            if device is not None:
                device.event(kind, arg)
        elif kind == "grad":
            grad[0] = arg
        elif kind == "begin_optimizer":
            tracker.begin_optimizer(OPTIMIZERS[arg], (), {})
        elif kind == "begin_forward":
            tracker.begin_forward(MODULES[arg], ())
        elif kind == "end_data":
            tracker.end_data()
        elif kind == "step":
            tracker.step(number=arg[0], samples=arg[1])
        elif kind == "tick":
            now[0] += arg
        elif kind == "nested":
            nested[0] = arg
        elif kind == "data_end":
            tracker.data_end(*arg)
        elif kind == "scope":
            tracker.end_scope()
            tracker.begin_scope(*arg)
        else:
            getattr(tracker, f"{kind}_{arg}")(None, ())
    tracker.finish()
    assert not tracker.failed


T0 = 1_700_000_000_000_000_000


class _Device:
    """Stand-in CUDA events on a device clock: an event recorded at CPU time ``t`` is reached at
    device time ``(t - T0) * 3 // 2`` (durations unlike the CPU's) and completes once the
    device's progress ``done`` has passed it. Deterministic in the timestamps only, so both
    trackers see the same device whatever their clock reads in between."""

    def __init__(self, now: list[int]) -> None:
        self.now = now
        self.done = 0
        self.active = True

    def event(self, kind: str, arg: Any) -> None:
        if kind == "gpu":
            self.done += arg
        else:
            self.active = arg

    def timing(self, emit: Any, max_pending: int) -> DeviceTiming:
        timing = DeviceTiming(emit, lambda: _Event(self), lambda: self.active, lambda: self.now[0])
        timing.max_pending = max_pending
        return timing


class _Event:
    def __init__(self, device: _Device) -> None:
        self.device = device
        self.at = -1

    def record(self) -> None:
        self.at = (self.device.now[0] - T0) * 3 // 2

    def query(self) -> bool:
        return self.at <= self.device.done

    def elapsed_time(self, end: _Event) -> float:
        assert self.query() and end.query()
        return (end.at - self.at) / 1e6

    def synchronize(self) -> None:
        self.device.done = max(self.device.done, self.at)


def _cuda_events() -> Any:
    return st.lists(
        st.one_of(
            _event(),
            st.tuples(st.just("gpu"), st.integers(0, 4 * 10**9)),
            st.tuples(st.just("cuda"), st.booleans()),
        ),
        max_size=200,
    )


def _folded(number: int, seconds: float, phases: Any, *rest: Any) -> tuple[Any, ...]:
    return (number, seconds, phases, *rest)


def _native_cuda_path(events: list[tuple[str, Any]], max_bytes: int, max_pending: int) -> tuple[Any, ...]:
    """Session._native_steps with device timing: the sink holds each step, on_held releases."""
    now, nested, grad = [T0], [False], [True]
    device = _Device(now)
    timing = device.timing(lambda step, ctx: None, max_pending)
    tracker: Any = step_tracker(
        lambda s: None,
        clock=timing.clock,
        native=True,
        grad_enabled=lambda: grad[0],
        on_first_open=lambda n: "warmup",
    )
    sink = native_sink()
    sink.hold(max_pending + 1)
    encoder = StepRecordEncoder(Identity("run", rank=3), RESOURCE, version="1.0")
    registry = CollectorRegistry()
    metrics = StepMetrics(IDENTITY, registry)
    metrics.read_from(sink, encoder.trace_ids)
    metrics.count_eval(lambda: tracker.eval_forwards)
    boundaries: list[tuple[Any, ...]] = []
    folded: list[tuple[Any, ...]] = []

    def on_boundary(number: int, _seconds: float) -> str | None:
        last = sink.last()  # a profiling window's live step ids (Session._live_native)
        assert last is not None and last.number == number
        boundaries.append((number, last.ordinal, last.trace_id, last.phases))
        return MARKS[number % 4]

    def released(training: bool, _wake: bool) -> None:
        if training:  # the OTLP metrics and the straggler read the released step
            f = sink.folded()
            assert f is not None
            folded.append(_folded(*f))

    def on_held() -> None:
        timing.drain_sink(sink, released)

    tracker.attach(sink, on_boundary, lambda: PARENT if nested[0] else None, None, None, on_held)
    _drive(tracker, events, now, nested, grad, device)
    timing.drain_sink(sink, released, wait=True)
    assert sink.held() is None
    requests = sink.encode(encoder.native, max_bytes)
    return exposition(registry, True), requests, boundaries, folded, timing.cpu_fallbacks


def _python_cuda_path(events: list[tuple[str, Any]], max_bytes: int, max_pending: int) -> tuple[Any, ...]:
    """The Python route: Session._on_step with device timing (DeviceTiming.add, then _record)."""
    now, nested, grad = [T0], [False], [True]
    device = _Device(now)
    encoder = StepRecordEncoder(Identity("run", rank=3), RESOURCE, native=False, version="1.0")
    registry = CollectorRegistry()
    metrics = StepMetrics(IDENTITY, registry)
    records = []
    ordinal = [0]
    boundaries: list[tuple[Any, ...]] = []
    folded: list[tuple[Any, ...]] = []
    mark: list[str | None] = ["warmup"]

    def emit(step: Step, ctx: StepContext) -> None:
        if not step.evaluation:
            phases = [(p, step.phase_totals_ns[p] / 1e9) for p in PHASES if p in step.phase_totals_ns]
            sizes = (step.samples, step.tokens, step.micro_batches)
            folded.append((step.number, step.duration_s, phases, *sizes, ctx.ordinal, ctx.parent_trace_id))
        metrics.observe(step, ctx)
        records.append(record(step, ctx))

    timing = device.timing(emit, max_pending)

    def on_step(step: Step) -> None:
        parent = PARENT if nested[0] else None
        ctx = StepContext(ordinal[0], step.number, encoder.trace_ids, parent)
        ordinal[0] += 1 + len(step.phases)
        if not step.evaluation:
            step.window, mark[0] = mark[0], MARKS[step.number % 4]
            phases = [(start, end) for _name, start, end in step.phases]
            boundaries.append((step.number, ctx.ordinal, parent and parent[0], phases))
        timing.add(step, ctx)

    # the native tracker handing Python Steps over, as the session did before the sink held
    # them: the same clock reads, so the same events (the Python tracker reads the clock at
    # other moments, and with CUDA toggled a timestamp may have an event on one side only)
    tracker: Any = step_tracker(on_step, clock=timing.clock, native=True, grad_enabled=lambda: grad[0])
    metrics.count_eval(lambda: tracker.eval_forwards)
    _drive(tracker, events, now, nested, grad, device)
    timing.drain(wait=True)
    requests = encoder.encode(records, max_bytes) if records else []
    return exposition(registry, True), requests, boundaries, folded, timing.cpu_fallbacks


@settings(max_examples=150, deadline=None)
@given(_cuda_events(), st.sampled_from([900, 3 * 1024 * 1024]), st.sampled_from([1, 3, 64]))
def test_cuda_timed_native_steps_equal_the_python_path(
    events: list[tuple[str, Any]], max_bytes: int, max_pending: int
) -> None:
    """The sink holding CUDA-timed steps until their events complete gives what the Python
    route gives: exposition, request bytes, live span ids at each boundary, OTLP readings, CPU
    fallbacks (events missing, the device too far behind)."""
    native_side = _native_cuda_path(events, max_bytes, max_pending)
    assert native_side == _python_cuda_path(events, max_bytes, max_pending)


def test_cuda_timed_steps_wait_for_the_device_in_the_sink() -> None:
    now = [T0]
    device = _Device(now)
    timing = device.timing(lambda step, ctx: None, 64)
    tracker: Any = step_tracker(lambda s: None, clock=timing.clock, native=True)
    sink = native_sink()
    sink.hold(65)
    tracker.attach(sink, on_held=lambda: timing.drain_sink(sink, lambda training, wake: None))
    for _ in range(3):
        now[0] += 1000
        tracker.begin_forward(None, ())
        now[0] += 1000
        tracker.end_forward(None, (), None)
        tracker.begin_optimizer(None, (), {})
        now[0] += 1000
        tracker.end_optimizer(None, (), {})
    tracker.step()
    held = sink.held_count
    assert held >= 3 and sink.metrics().steps == 0 and sink.pending == 0  # the device has run nothing
    assert sink.last() is not None  # the newest step's span ids, for a profiling window
    device.done = 10**9
    timing.drain_sink(sink, lambda training, wake: None)
    assert sink.held_count == 0 and sink.metrics().steps == held and sink.pending == held
    device.done = 0
    now[0] += 1000
    tracker.begin_forward(None, ())
    now[0] += 1000
    tracker.step()
    assert sink.held_count == 1
    held_step = sink.held()
    assert held_step is not None
    with pytest.raises(ValueError, match="phases"):
        sink.release(1, [(1, 2)] * (len(held_step[3]) + 1))
    assert sink.held_count == 1  # nothing released


def _probe() -> Any:
    """Session.peaks' stand-in: each training step's memory, a sequence with every shape
    (None, peaks missing, OOMs caught), the same on both routes."""
    count = [0]

    def probe() -> tuple[int | None, int | None, int | None, int] | None:
        n = count[0] = count[0] + 1
        if n % 5 == 0:
            return None
        return (n * 1000 if n % 3 else None, n * 2000 if n % 3 else None, n * 4096, n % 2)

    return probe


def _native_path(
    events: list[tuple[str, Any]], max_bytes: int, cuda_from: int | None = None
) -> tuple[list[str], list[bytes], list[int]]:
    """``cuda_from``: the training step from which torch.cuda's ``_initialized`` reads True
    (the probe is due from then on; None: no ``probe_when``, due at every step)."""
    now, nested, grad = [1_700_000_000_000_000_000], [False], [True]
    cuda = {"_initialized": cuda_from == 0}
    tracker: Any = step_tracker(
        lambda s: None,
        clock=lambda: now[0],
        native=True,
        grad_enabled=lambda: grad[0],
        on_first_open=lambda n: "warmup",
    )
    sink = native_sink()
    encoder = StepRecordEncoder(Identity("run", rank=3), RESOURCE, version="1.0")
    registry = CollectorRegistry()
    metrics = StepMetrics(IDENTITY, registry)
    metrics.read_from(sink, encoder.trace_ids)
    metrics.count_eval(lambda: tracker.eval_forwards)
    boundaries: list[int] = []

    def on_boundary(number: int, _seconds: float) -> str | None:
        boundaries.append(number)
        cuda["_initialized"] = cuda_from is not None and len(boundaries) >= cuda_from
        return MARKS[number % 4]  # the next step's mark

    when = None if cuda_from is None else cuda
    tracker.attach(sink, on_boundary, lambda: PARENT if nested[0] else None, probe=_probe(), probe_when=when)
    _drive(tracker, events, now, nested, grad)
    return exposition(registry, True), sink.encode(encoder.native, max_bytes), boundaries


def _python_path(
    events: list[tuple[str, Any]], max_bytes: int, cuda_from: int | None = None
) -> tuple[list[str], list[bytes], list[int]]:
    now, nested, grad = [1_700_000_000_000_000_000], [False], [True]
    encoder = StepRecordEncoder(Identity("run", rank=3), RESOURCE, native=False, version="1.0")
    registry = CollectorRegistry()
    metrics = StepMetrics(IDENTITY, registry)
    records = []
    ordinal = [0]
    numbers: list[int] = []  # the boundaries: an evaluation scope is none
    mark: list[str | None] = ["warmup"]  # the first step's
    probe = _probe()

    def on_step(step: Step) -> None:  # what Session._on_step and StepSpans do with a step
        ctx = StepContext(ordinal[0], step.number, encoder.trace_ids, PARENT if nested[0] else None)
        ordinal[0] += 1 + len(step.phases)
        if not step.evaluation:  # an evaluation scope takes no mark and leaves the next step's
            # MemoryPeaks with the resident peak read elsewhere: nothing before CUDA is initialised
            step.memory = probe() if cuda_from is None or len(numbers) >= cuda_from else None
            step.window, mark[0] = mark[0], MARKS[step.number % 4]
            numbers.append(step.number)
        metrics.observe(step, ctx)
        records.append(record(step, ctx))

    tracker: Any = step_tracker(on_step, clock=lambda: now[0], native=False, grad_enabled=lambda: grad[0])
    metrics.count_eval(lambda: tracker.eval_forwards)
    _drive(tracker, events, now, nested, grad)
    return exposition(registry, True), encoder.encode(records, max_bytes) if records else [], numbers


@settings(max_examples=150, deadline=None)
@given(_events(), st.sampled_from([900, 3 * 1024 * 1024]), st.sampled_from([None, 0, 2]))
def test_native_steps_equal_the_python_path(
    events: list[tuple[str, Any]], max_bytes: int, cuda_from: int | None
) -> None:
    """Equal spans and metrics; with ``probe_when``, the native tracker calls the probe only
    from the step that finds CUDA initialised (the Python route's probe has nothing before)."""
    native_side = _native_path(events, max_bytes, cuda_from)
    assert native_side == _python_path(events, max_bytes, cuda_from)
    if native_side[2] and not cuda_from:  # a training step: the probe's first reading is on its span
        assert any(b"otelprof.memory.peak.resident_bytes" in r for r in native_side[1])
    if cuda_from and len(native_side[2]) <= cuda_from:  # no step found CUDA: no memory on any span
        assert not any(b"otelprof.memory" in r for r in native_side[1])


def _train(tracker: Any, steps: int) -> None:
    for _ in range(steps):
        tracker.begin_data()
        tracker.data_end(8, None)
        tracker.begin_forward(None, ())
        tracker.end_forward(None, (), None)
        tracker.begin_optimizer(None, (), {})
        tracker.end_optimizer(None, (), {})
    tracker.begin_data()


def test_a_full_queue_drops_spans_but_not_metrics() -> None:
    tracker: Any = step_tracker(lambda s: None, native=True)
    sink = native.StepSink(3, 2)
    woken: list[int] = []
    tracker.attach(sink, notify=lambda: woken.append(sink.pending))
    _train(tracker, 5)
    assert woken == [2]  # once, when the queue reached the batch size
    assert sink.pending == 3 and sink.spans_dropped == 2
    metrics = sink.metrics()
    assert metrics[3] == 5 and metrics[4] == 40  # steps, samples
    encoder = StepRecordEncoder(Identity("run"), RESOURCE)
    [request] = sink.encode(encoder.native, 1 << 20)
    assert sink.pending == 0 and sink.encode(encoder.native, 1 << 20) == []
    assert request.count(b"train.step") == 3


def test_the_context_variable_spares_the_parent_lookup() -> None:
    import contextvars

    var: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("ctx", default=())  # sized, like a Context
    calls: list[int] = []

    def parent() -> tuple[bytes, bytes] | None:
        calls.append(1)
        return PARENT

    tracker: Any = step_tracker(lambda s: None, native=True)
    sink = native.StepSink(100, 100)
    tracker.attach(sink, parent=parent, context_var=var)
    _train(tracker, 3)
    assert calls == []  # an empty context: no span to nest under, no call
    var.set(("span",))
    _train(tracker, 2)
    assert len(calls) == 2
    [(_counts, _sum), exemplars, *_] = sink.metrics()
    assert {e[1] for e in exemplars if e is not None} == {PARENT[0]}
    with pytest.raises(TypeError, match="ContextVar"):
        tracker.attach(sink, context_var={})


def test_a_failing_boundary_callback_stops_the_tracker() -> None:
    errors: list[BaseException] = []

    def boundary(number: int, seconds: float) -> None:
        raise ValueError(f"step {number}")

    tracker: Any = step_tracker(lambda s: None, on_error=errors.append, native=True)
    tracker.attach(native.StepSink(10, 10), boundary)
    _train(tracker, 3)
    assert tracker.failed and [str(e) for e in errors] == ["step 0"]


@pytest.mark.parametrize("native_path", [True, False], ids=["native", "python"])
def test_every_scrape_is_one_snapshot(native_path: bool) -> None:
    """Steps close on a training thread while scrapes run: within every scrape, the counters
    that move together agree (steps, samples, tokens, micro-batches, the histograms' counts)."""
    import threading

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    metrics = StepMetrics(IDENTITY, registry)
    encoder = StepRecordEncoder(Identity("run"), RESOURCE, native=native_path)
    if native_path:
        tracker: Any = step_tracker(lambda s: None, native=True)
        sink = native_sink()
        metrics.read_from(sink, encoder.trace_ids)
        tracker.attach(sink)
    else:
        tracker = step_tracker(lambda s: metrics.observe(s, SimpleNamespace(trace_id=b"\x01" * 16)), native=False)

    def train() -> None:
        for _ in range(3000):
            tracker.begin_data()
            tracker.data_end(8, 128)
            tracker.begin_forward(None, ())
            tracker.end_forward(None, (), None)
            tracker.begin_backward()
            tracker.end_backward()
            tracker.begin_optimizer(None, (), {})
            tracker.end_optimizer(None, (), {})

    thread = threading.Thread(target=train)
    thread.start()
    scrapes = 0
    while True:
        running = thread.is_alive()
        text = generate_latest(registry).decode()
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        steps = values["otelprof_steps_total"]
        assert values["otelprof_samples_total"] == 8 * steps
        assert values["otelprof_tokens_total"] == 128 * steps
        assert values["otelprof_micro_batches_total"] == steps
        assert values["otelprof_step_duration_seconds_count"] == steps
        scrapes += 1
        if not running:
            break
    thread.join()
    assert steps == 2999 and scrapes >= 1  # the last step waits for the next fetch


@settings(max_examples=150, deadline=None)
@given(_events())
def test_the_folded_step_gives_otlp_what_a_python_step_gives(events: list[tuple[str, Any]]) -> None:
    """With OTLP metrics steps stay native: the sink's FoldedStep, read at each boundary, holds
    what OtlpMetrics.observe reads from a Python Step (duration, phase totals, sizes, span ids)."""
    now, nested, grad = [1_700_000_000_000_000_000], [False], [True]
    tracker: Any = step_tracker(lambda s: None, clock=lambda: now[0], native=True, grad_enabled=lambda: grad[0])
    sink = native_sink()
    folded: list[tuple[Any, ...]] = []

    def on_boundary(number: int, _seconds: float) -> None:
        f = sink.folded()
        assert f is not None and f.number == number
        folded.append((f.number, f.seconds, f.phases, f.samples, f.tokens, f.micro_batches, f.ordinal, f.trace_id))

    tracker.attach(sink, on_boundary, lambda: PARENT if nested[0] else None)
    _drive(tracker, events, now, nested, grad)

    now, nested, grad = [1_700_000_000_000_000_000], [False], [True]
    expected: list[tuple[Any, ...]] = []
    ordinal = [0]

    def on_step(step: Step) -> None:
        if not step.evaluation:
            phases = [(p, step.phase_totals_ns[p] / 1e9) for p in PHASES if p in step.phase_totals_ns]
            trace = PARENT[0] if nested[0] else None
            sizes = (step.samples, step.tokens, step.micro_batches)
            expected.append((step.number, step.duration_s, phases, *sizes, ordinal[0], trace))
        ordinal[0] += 1 + len(step.phases)

    python: Any = step_tracker(on_step, clock=lambda: now[0], native=False, grad_enabled=lambda: grad[0])
    _drive(python, events, now, nested, grad)
    assert folded == expected
