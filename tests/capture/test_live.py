"""A real torch training loop under the instrumentor: step spans with phases at a real OTLP
receiver, and step metrics with exemplars scraped from /metrics (OpenMetrics parser)."""

from __future__ import annotations

import itertools
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import native_module
from export.receivers import HttpReceiver, http_receiver
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import otelprof
from capture import live_session
from otelprof.otlp import ids

torch = pytest.importorskip("torch")

STEPS = 6
BATCH = 4
SEQ = 16


def _model() -> Any:
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    return torch.nn.Sequential(torch.nn.Embedding(100, 32), torch.nn.TransformerEncoder(layer, num_layers=2))


def _train(num_workers: int = 0) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 100, (STEPS * BATCH, SEQ))
    loader = torch.utils.data.DataLoader(tokens, batch_size=BATCH, num_workers=num_workers)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for batch in loader:
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


@pytest.fixture
def session(receiver: HttpReceiver, tmp_path: Path) -> Iterator[otelprof.instrumentation.Session]:
    session = live_session.start(receiver.port, tmp_path, OTELPROF_RUN_ID="test-run", OTEL_SERVICE_NAME="trainer")
    yield session
    live_session.stop(session)


def _flush(session: otelprof.instrumentation.Session) -> None:
    assert session.exporter is not None and session.exporter.flush(10)


def _spans(rec: HttpReceiver) -> list[tuple[ResourceSpans, PbSpan]]:
    return [(rs, s) for r in rec.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


def test_steps_and_phases_arrive_as_spans(session: otelprof.instrumentation.Session, receiver: HttpReceiver) -> None:
    _train()
    otelprof.uninstrument()
    _flush(session)
    spans = [s for _rs, s in _spans(receiver)]
    steps = [s for s in spans if s.name == "train.step"]
    assert len(steps) == STEPS
    for n, step in enumerate(steps):
        attrs = {kv.key: kv.value for kv in step.attributes}
        assert attrs["otelprof.step.number"].int_value == n
        assert attrs["otelprof.step.samples"].int_value == BATCH
        assert attrs["otelprof.step.tokens"].int_value == BATCH * SEQ
        assert step.trace_id == ids.trace_id(f"step|test-run|{n}")  # the converter's rule
        assert step.parent_span_id == b""
        children = [s for s in spans if s.parent_span_id == step.span_id]
        # a forward phase's name adds its root module's class (otelprof.phase.module)
        assert [c.name for c in children] == ["data", "forward Sequential", "backward", "optimizer"]
        for child in children:
            assert child.trace_id == step.trace_id
            assert step.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
            assert child.end_time_unix_nano <= step.end_time_unix_nano
    for a, b in itertools.pairwise(steps):
        assert a.end_time_unix_nano == b.start_time_unix_nano  # steps tile the loop
    resource = {kv.key: kv.value for kv in _spans(receiver)[0][0].resource.attributes}
    assert resource["service.name"].string_value == "trainer"
    assert resource["otelprof.run.id"].string_value == "test-run"
    assert resource["otelprof.distributed.rank"].int_value == 0


def test_metrics_with_exemplars_on_the_metrics_endpoint(
    session: otelprof.instrumentation.Session, receiver: HttpReceiver
) -> None:
    _train()
    request = urllib.request.Request(
        f"http://127.0.0.1:{session.metrics_port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    labels = {"run": "test-run", "rank": "0", "local_rank": "0"}
    steps = families["otelprof_steps"].samples
    # the last step closes at the fetch that ends the epoch (StopIteration)
    assert [(s.name, s.labels, s.value) for s in steps if s.name == "otelprof_steps_total"] == [
        ("otelprof_steps_total", labels, STEPS)
    ]
    buckets = [s for s in families["otelprof_step_duration_seconds"].samples if s.name.endswith("_bucket")]
    exemplars = [s.exemplar for s in buckets if s.exemplar is not None]
    assert exemplars, "no exemplar on the step histogram"
    trace_ids = {ids.trace_id(f"step|test-run|{n}").hex() for n in range(STEPS)}
    assert all(e.labels["trace_id"] in trace_ids for e in exemplars)
    phases = {
        s.labels["phase"]: s.value
        for s in families["otelprof_step_phase_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert phases == {"data": STEPS, "forward": STEPS, "backward": STEPS, "optimizer": STEPS}
    samples = families["otelprof_samples"].samples
    assert [s.value for s in samples if s.name == "otelprof_samples_total"] == [BATCH * STEPS]
    assert families["otelprof_last_step_timestamp_seconds"].samples[0].value > 1.7e9
    assert families["otelprof_process_cpu_seconds"].samples[0].value > 0


def test_uninstrument_restores_every_hook_and_instrument_twice_does_not_double(
    session: otelprof.instrumentation.Session, receiver: HttpReceiver
) -> None:
    from torch.optim import optimizer
    from torch.utils.data import dataloader

    assert hasattr(torch.autograd.backward, "__wrapped__")  # instrumented: our wrappers are in place
    assert hasattr(dataloader._BaseDataLoaderIter.__next__, "__wrapped__")
    assert otelprof.instrument() is session  # the second call keeps the first session
    _train()
    otelprof.uninstrument()
    assert not hasattr(torch.autograd.backward, "__wrapped__")
    assert not hasattr(dataloader._BaseDataLoaderIter.__next__, "__wrapped__")
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert not torch.nn.modules.module._global_forward_hooks
    assert not optimizer._global_optimizer_pre_hooks
    assert not optimizer._global_optimizer_post_hooks
    _flush(session)
    steps = [s for _rs, s in _spans(receiver) if s.name == "train.step"]
    assert len(steps) == STEPS  # once each, not twice
    _train()  # after uninstrument: nothing more is recorded
    _flush(session)
    assert len([s for _rs, s in _spans(receiver) if s.name == "train.step"]) == STEPS


def test_the_exporter_follows_the_environment_given_to_instrument(tmp_path: Path) -> None:
    """instrument(environ=...) configures the exporter it creates from that mapping, not from
    os.environ: here no endpoint, so the steps land in the spool folder it names. uninstrument()
    shuts that exporter down: no thread of the session outlives it (sessions used to leave
    their exporter's thread behind, one per instrument/uninstrument cycle)."""
    from prometheus_client import CollectorRegistry

    from otelprof.export.spool import Spool

    spool = tmp_path / "spool"
    environ = {"OTELPROF_SPOOL_DIR": str(spool), "OTEL_EXPORTER_PROMETHEUS_PORT": "0", "OTELPROF_PROFILE": "false"}
    threads = set(threading.enumerate())
    session = otelprof.instrument(environ=environ, registry=CollectorRegistry())
    assert session is not None
    _train()
    assert {t.name for t in set(threading.enumerate()) - threads} >= {"otelprof-exporter", "otelprof-step-spans"}
    otelprof.uninstrument()
    assert [t.name for t in set(threading.enumerate()) - threads] == []
    assert session.exporter is not None and not session.exporter.config.endpoint_configured
    spans = [s for _p, data in Spool(spool) for s in _decode(data)]
    assert len([s for s in spans if s.name == "train.step"]) == STEPS


def _decode(data: bytes) -> list[PbSpan]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(data)
    return [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def test_steps_nest_under_the_applications_current_span(
    session: otelprof.instrumentation.Session, receiver: HttpReceiver
) -> None:
    """An inference server's request span is current while it runs the model: the step (a
    step_scope) becomes its child, in its trace; a step outside any span keeps its own trace,
    and so does its exemplar."""
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("app")
    model = _model().eval()
    batch = torch.randint(0, 100, (BATCH, SEQ))
    with tracer.start_as_current_span("request") as request, otelprof.step_scope("infer.step"), torch.no_grad():
        model(batch)
    with otelprof.step_scope("infer.step"), torch.no_grad():
        model(batch)
    otelprof.uninstrument()
    _flush(session)
    spans = [s for _rs, s in _spans(receiver)]
    nested, own = [s for s in spans if s.name == "infer.step"]
    ctx = request.get_span_context()
    assert nested.trace_id == ctx.trace_id.to_bytes(16, "big")
    assert nested.parent_span_id == ctx.span_id.to_bytes(8, "big")
    assert [c.name for c in spans if c.parent_span_id == nested.span_id] == ["forward Sequential"]
    number = {kv.key: kv.value.int_value for kv in own.attributes}["otelprof.step.number"]
    assert own.trace_id == ids.trace_id(f"step|test-run|{number}") and own.parent_span_id == b""


def test_step_span_requests_stay_under_the_configured_size(tmp_path: Path) -> None:
    """OTELPROF_MAX_REQUEST_BYTES bounds the live step spans' requests too (they used a fixed
    3 MiB before the settings registry)."""
    from otelprof.export.spool import Spool

    spool = tmp_path / "spool"
    environ = {
        "OTELPROF_SPOOL_DIR": str(spool),
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTELPROF_PROFILE": "false",
        "OTELPROF_MAX_REQUEST_BYTES": "2048",
    }
    from prometheus_client import CollectorRegistry

    session = otelprof.instrument(environ=environ, registry=CollectorRegistry())
    assert session is not None
    _train()  # the session starts at the first step
    assert session.spans is not None and session.spans.max_request_bytes == 2048
    otelprof.uninstrument()
    requests = [data for _p, data in Spool(spool)]
    assert len(requests) > 1 and max(len(data) for data in requests) <= 2048
    steps = [s for data in requests for s in _decode(data) if s.name == "train.step"]
    assert len(steps) == STEPS


class _StandInEvent:
    """A CUDA event stand-in on a device that spends 1 ms between consecutive records and has
    run everything recorded (query() is True): steps get device durations in whole ms."""

    recorded = 0

    def __init__(self) -> None:
        self.at = 0

    def record(self) -> None:
        _StandInEvent.recorded += 1
        self.at = _StandInEvent.recorded * 1_000_000

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _StandInEvent) -> float:
        return (end.at - self.at) / 1e6

    def synchronize(self) -> None:
        pass


def test_cuda_timed_steps_take_the_native_sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With device timing the session holds each step in the native step sink until its events
    complete and releases it with the device's times: spans carry the device durations."""
    from prometheus_client import CollectorRegistry

    from otelprof.capture import session as session_module
    from otelprof.capture.steps.device_timing import DeviceTiming
    from otelprof.export.spool import Spool

    native_module()
    monkeypatch.setattr(session_module, "cuda_timing", lambda emit: DeviceTiming(emit, _StandInEvent, lambda: True))
    spool = tmp_path / "spool"
    environ = {"OTELPROF_SPOOL_DIR": str(spool), "OTEL_EXPORTER_PROMETHEUS_PORT": "0", "OTELPROF_PROFILE": "false"}
    registry = CollectorRegistry()
    session = otelprof.instrument(environ=environ, registry=registry)
    assert session is not None and session.timing is not None
    _train()
    sink = session._sink
    assert sink is not None and sink.held_count == 0  # every event complete: released at once
    otelprof.uninstrument()
    assert sink.metrics().steps == STEPS and sink.held_count == 0  # the last one released at close
    steps = [s for _p, data in Spool(spool) for s in _decode(data) if s.name == "train.step"]
    assert len(steps) == STEPS
    assert all((s.end_time_unix_nano - s.start_time_unix_nano) % 1_000_000 == 0 for s in steps)
