"""What every framework test checks, from decoded spans and a /metrics scrape."""

from __future__ import annotations

import itertools
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capture import live_session
from export.receivers import HttpReceiver, http_receiver
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import otelprof

#: The attribute the micro-batch count of a step goes in (the framework callbacks give their own).
MICRO_BATCHES = "otelprof.step.micro_batches"


@dataclass
class Truth:
    """The loop's own counts, one entry per optimizer update, and its evaluations."""

    samples: list[int] = field(default_factory=list)
    tokens: list[int | None] = field(default_factory=list)
    micro_batches: list[int] = field(default_factory=list)
    evaluations: int = 0
    evaluated_after: list[int] = field(default_factory=list)  # updates done before each evaluation


@dataclass
class Captured:
    spans: list[Span]
    metrics: dict[str, Any]  # family name -> family
    resource: dict[str, Any]

    def named(self, name: str) -> list[Span]:
        return sorted((s for s in self.spans if s.name == name), key=lambda s: s.start_time_unix_nano)

    def children(self, span: Span) -> list[Span]:
        kids = [s for s in self.spans if s.parent_span_id == span.span_id and s.trace_id == span.trace_id]
        return sorted(kids, key=lambda s: s.start_time_unix_nano)

    def total(self, family: str) -> float:
        return float(sum(s.value for s in self.metrics[family].samples if s.name == f"{family}_total"))


def attrs_value(value: Any) -> Any:
    return getattr(value, str(value.WhichOneof("value")))


def attrs(span: Span) -> dict[str, Any]:
    return {kv.key: attrs_value(kv.value) for kv in span.attributes}


def phase_of(span: Span) -> str:
    """A phase span's phase (``otelprof.phase.name``); its name adds the module: ``forward Model``."""
    value: str = attrs(span)["otelprof.phase.name"]
    module = attrs(span).get("otelprof.phase.module")
    assert span.name == (f"{value} {module}" if module else value)
    return value


def phase_spans(captured: Captured, span: Span) -> list[Span]:
    """A step's (or evaluation's) phase spans: its children but a profiling window's
    ``ProfilerStep#N`` (the early window records steps 11 and 12 of a run)."""
    return [c for c in captured.children(span) if "otelprof.phase.name" in attrs(c)]


@contextmanager
def instrumented(
    tmp_path: Path, scrape_metrics: bool = True, **env: str
) -> Iterator[tuple[otelprof.instrumentation.Session, list[Captured]]]:
    """``otelprof.instrument()`` as a user calls it (exporting to a real OTLP receiver, metrics
    on a free port); what arrived is appended to the list once the block ends: the metrics
    scraped at the end of the block, before ``uninstrument()``."""
    out: list[Captured] = []
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp_path, **env)
        try:
            yield session, out
            metrics = scrape(session) if scrape_metrics else {}
        finally:
            live_session.stop(session)
        out.append(_captured(rec, metrics))


def scrape(session: otelprof.instrumentation.Session) -> dict[str, Any]:
    assert session.metrics_port, "no /metrics endpoint"
    request = urllib.request.Request(
        f"http://127.0.0.1:{session.metrics_port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _captured(rec: HttpReceiver, metrics: dict[str, Any]) -> Captured:
    resource: dict[str, Any] = {}
    for request in rec.requests:
        for rs in request.resource_spans:
            resource = {kv.key: attrs_value(kv.value) for kv in rs.resource.attributes}
    return Captured(rec.spans, metrics, resource)


def check_steps(captured: Captured, truth: Truth) -> list[Span]:
    """One ``train.step`` span per optimizer update, numbered by the updates done before it
    (0, 1, ...), with the update's samples and tokens."""
    steps = captured.named("train.step")
    assert len(steps) == len(truth.samples)
    assert [attrs(s)["otelprof.step.number"] for s in steps] == list(range(len(truth.samples)))
    assert [attrs(s).get("otelprof.step.samples") for s in steps] == truth.samples
    assert [attrs(s).get("otelprof.step.tokens") for s in steps] == truth.tokens
    for a, b in itertools.pairwise(steps):
        assert a.end_time_unix_nano <= b.start_time_unix_nano
    return steps


def check_phases(captured: Captured, steps: list[Span]) -> None:
    for step in steps:
        phases = phase_spans(captured, step)
        assert phases, "a step without phases"
        assert {phase_of(p) for p in phases} <= {"data", "forward", "backward", "optimizer"}
        for phase in phases:
            assert step.start_time_unix_nano <= phase.start_time_unix_nano <= phase.end_time_unix_nano
            assert phase.end_time_unix_nano <= step.end_time_unix_nano
        for a, b in itertools.pairwise(phases):
            assert a.end_time_unix_nano <= b.start_time_unix_nano, f"{a.name} overlaps {b.name}"
        total = sum(p.end_time_unix_nano - p.start_time_unix_nano for p in phases)
        assert total <= step.end_time_unix_nano - step.start_time_unix_nano


def check_evaluations(captured: Captured, truth: Truth, steps: list[Span], phase: str = "forward") -> None:
    """Each evaluation is one ``evaluation`` span with its ``phase`` (its forwards), outside every
    training step, numbered as the training steps are: the updates done before it."""
    evaluations = captured.named("evaluation")
    assert len(evaluations) == truth.evaluations
    assert [attrs(e).get("otelprof.step.number") for e in evaluations] == truth.evaluated_after
    traces = {attrs(s)["otelprof.step.number"]: s.trace_id for s in steps}
    for evaluation in evaluations:  # in the trace of the training step after it, if one came
        number = attrs(evaluation)["otelprof.step.number"]
        assert evaluation.trace_id == traces.get(number, evaluation.trace_id)
    for evaluation in evaluations:
        assert phase in {phase_of(p) for p in phase_spans(captured, evaluation)}
        for step in steps:
            assert (
                evaluation.end_time_unix_nano <= step.start_time_unix_nano
                or step.end_time_unix_nano <= evaluation.start_time_unix_nano
            ), "an evaluation inside a training step"


def check_metrics(captured: Captured, truth: Truth) -> None:
    """/metrics counts the training steps, and their samples and tokens, alone."""
    assert captured.total("otelprof_steps") == len(truth.samples)
    assert captured.total("otelprof_samples") == sum(truth.samples)
    assert captured.total("otelprof_tokens") == sum(t or 0 for t in truth.tokens)


def check_micro_batches(captured: Captured, truth: Truth) -> None:
    steps = captured.named("train.step")
    assert [attrs(s).get(MICRO_BATCHES) for s in steps] == truth.micro_batches
