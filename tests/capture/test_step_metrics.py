"""StepMetrics (plain numbers read at scrape time) against prometheus-client's own Histogram,
Counter and Gauge fed the same steps: the same exposition, text and OpenMetrics with exemplars."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from otelprof.capture.metrics.step_metrics import FOLD_STEPS, LABELS, STEP_BUCKETS, StepMetrics
from otelprof.capture.steps.step import PHASES, Step

IDENTITY = {"run": "r", "rank": "3", "local_rank": "1"}
VALUES = [IDENTITY[k] for k in LABELS]


def library_metrics(registry: CollectorRegistry, steps: list[tuple[Step, bytes]], dropped: int, evals: int = 0) -> None:
    """What StepMetrics exposes, built with prometheus-client's metric classes."""
    duration = Histogram(
        "otelprof_step_duration_seconds", "Training step wall time.", LABELS, registry=registry, buckets=STEP_BUCKETS
    ).labels(*VALUES)
    phase = Histogram(
        "otelprof_step_phase_duration_seconds",
        "Time per step in each phase (data wait, forward, backward, optimizer).",
        (*LABELS, "phase"),
        registry=registry,
        buckets=STEP_BUCKETS,
    )
    phases = {p: phase.labels(*VALUES, p) for p in PHASES}
    count = Counter("otelprof_steps", "Training steps completed.", LABELS, registry=registry).labels(*VALUES)
    samples = Counter("otelprof_samples", "Samples processed.", LABELS, registry=registry).labels(*VALUES)
    tokens = Counter("otelprof_tokens", "Tokens processed.", LABELS, registry=registry).labels(*VALUES)
    batches = Counter(
        "otelprof_micro_batches",
        "DataLoader batches (micro-batches) of the steps completed.",
        LABELS,
        registry=registry,
    ).labels(*VALUES)
    Counter(
        "otelprof_eval_forwards",
        "Forward passes charged to no training step (evaluation, inference).",
        LABELS,
        registry=registry,
    ).labels(*VALUES).inc(evals)
    spans_dropped = Counter(
        "otelprof_step_spans_dropped", "Step spans dropped because the encoder fell behind.", LABELS, registry=registry
    ).labels(*VALUES)
    last = Gauge(
        "otelprof_last_step_timestamp_seconds", "When the last step ended (Unix time).", LABELS, registry=registry
    ).labels(*VALUES)
    samples_rate = Gauge(
        "otelprof_samples_per_second", "Samples per second in the last step.", LABELS, registry=registry
    ).labels(*VALUES)
    tokens_rate = Gauge(
        "otelprof_tokens_per_second", "Tokens per second in the last step.", LABELS, registry=registry
    ).labels(*VALUES)
    for step, trace_id in steps:
        seconds = step.duration_s
        duration.observe(seconds, exemplar={"trace_id": trace_id.hex()})
        count.inc()
        for p, ns in step.phase_totals_ns.items():
            phases[p].observe(ns / 1e9)
        last.set(step.end_ns / 1e9)
        batches.inc(step.micro_batches)
        if step.samples is not None:
            samples.inc(step.samples)
            if seconds > 0:
                samples_rate.set(step.samples / seconds)
        if step.tokens is not None:
            tokens.inc(step.tokens)
            if seconds > 0:
                tokens_rate.set(step.tokens / seconds)
    spans_dropped.inc(dropped)


def exposition(registry: CollectorRegistry, openmetrics: bool) -> list[str]:
    """The otelprof step series' lines, without _created (prometheus-client's objects add it)
    and exemplar timestamps (they take the observation's clock, StepMetrics the step's end)."""
    text = (generate_openmetrics if openmetrics else generate_latest)(registry).decode()
    lines = []
    for line in text.splitlines():
        if "_created" in line or "process_" in line:
            continue
        if " # {" in line:
            line = line.rsplit(" ", 1)[0]  # the exemplar's timestamp
        lines.append(line)
    return lines


durations = st.integers(min_value=0, max_value=700 * 10**9)
step_lists = st.lists(
    st.tuples(
        durations,
        st.dictionaries(st.sampled_from(PHASES), durations),
        st.one_of(st.none(), st.integers(min_value=0, max_value=10**6)),
        st.one_of(st.none(), st.integers(min_value=0, max_value=10**9)),
        st.binary(min_size=16, max_size=16),
        st.integers(min_value=0, max_value=64),
    ),
    max_size=2 * FOLD_STEPS + 5,  # folds on the training thread, and the rest at the scrape
)


@settings(max_examples=150, deadline=None)
@given(
    step_lists,
    st.integers(min_value=0, max_value=5),
    st.sampled_from([*[int(b * 1e9) for b in STEP_BUCKETS], 1, 999_999]),
    st.integers(min_value=0, max_value=10**6),
)
def test_same_exposition_as_prometheus_client(raw: list, dropped: int, boundary: int, evals: int) -> None:
    # a step exactly on a bucket bound goes in that bucket (le is inclusive)
    raw = [*raw, (boundary, {"data": boundary}, 8, None, b"\x01" * 16, 3)]
    steps = []
    for k, (ns, phases, samples, tokens, trace_id, batches) in enumerate(raw):
        start = 1_700_000_000_000_000_000 + k * 10**12
        step = Step(k, start, start + ns, [], phases, samples=samples, tokens=tokens, micro_batches=batches)
        steps.append((step, trace_id))
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    metrics = StepMetrics(IDENTITY, ours)
    metrics.count_eval(lambda: evals)
    for step, trace_id in steps:
        metrics.observe(step, SimpleNamespace(trace_id=trace_id))
    for _ in range(dropped):
        metrics.span_dropped()
    library_metrics(theirs, steps, dropped, evals)
    assert exposition(ours, False) == exposition(theirs, False)
    assert exposition(ours, True) == exposition(theirs, True)


def test_exemplars_parse_with_the_openmetrics_parser() -> None:
    registry = CollectorRegistry()
    metrics = StepMetrics(IDENTITY, registry)
    start = 1_700_000_000_000_000_000
    metrics.observe(
        Step(7, start, start + 30_000_000, [], {"forward": 10_000_000}, samples=4),
        SimpleNamespace(trace_id=b"\xab" * 16),
    )
    families = {f.name: f for f in text_string_to_metric_families(generate_openmetrics(registry).decode())}
    buckets = [s for s in families["otelprof_step_duration_seconds"].samples if s.name.endswith("_bucket")]
    hit = [s for s in buckets if s.exemplar is not None]
    assert [(s.labels["le"], s.exemplar.labels, s.exemplar.value) for s in hit] == [
        ("0.05", {"trace_id": "ab" * 16}, 0.03)
    ]
    assert float(hit[0].exemplar.timestamp) == pytest.approx(1_700_000_000.03)  # the step's end
    assert families["otelprof_steps"].samples[0].value == 1
    assert families["otelprof_samples_per_second"].samples[0].value == 4 / 0.03
    metrics.unregister()
    assert "otelprof_step" not in generate_latest(registry).decode()
