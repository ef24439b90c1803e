"""End to end against a real MLflow tracking server, a third-party OTLP/HTTP backend.

A session-scoped fixture (``tests/export/mlflow_server.py``) starts ``mlflow server`` on
127.0.0.1 (SQLite store, one worker, no job execution). Spans converted from shared GPU traces
are sent with otelprof's own exporter code, configured only through
``OTEL_EXPORTER_OTLP_TRACES_*`` variables, and read back through MLflow's own client. Every span
is compared field by field with the decoded request that was sent (official opentelemetry-proto
classes).

What MLflow (3.14 and later) does with OTLP spans, as these tests pin down:

- kept: trace and span ids, parents, names, start/end nanoseconds, status, span attributes,
  span events (with their attributes), span links (with their attributes);
- resource attributes become *trace tags*, values as strings (non-strings JSON-encoded), except
  ``telemetry.sdk.*`` (and ``mlflow.*``), which it skips
  (``SqlAlchemyStore._log_spans_once`` in ``mlflow/store/tracking/sqlalchemy_store.py``);
- a string attribute holding a JSON array, object or string (otelprof's "string (JSON)"
  attributes such as ``otelprof.op.input_dims``) reads back as the decoded JSON value:
  ``sanitize_attributes`` in ``mlflow/tracing/otel/translation/__init__.py`` strips what it
  takes for a second layer of encoding;
- added: ``mlflow.*`` bookkeeping attributes (``mlflow.traceRequestId``) on every span, and
  on a step span ``mlflow.spanInputs`` / ``mlflow.spanOutputs``, its OpenInference
  ``input.value`` / ``output.value`` (``translate_span_when_storing``), which on a trace's root
  become the trace list's request and response previews (``_update_trace_info_attributes``);
- not stored: span kind (every otelprof span is ``INTERNAL``, MLflow's default, so nothing is
  lost), the instrumentation scope, ``dropped_*_count`` (zero here: no caps are hit).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from converter_helpers import RUNTIME_CATEGORIES, shared_trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from prometheus_client import CollectorRegistry

from otelprof.converter import convert
from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import Exporter
from otelprof.export.http import send
from otelprof.export.result import ExportResult
from otelprof.otlp import ids
from otelprof.resource import options_from_env

from .mlflow_server import MlflowServer
from .receivers import free_port

pytest.importorskip("mlflow", reason="mlflow is not installed (it is in the 'test' extra: pip install -e '.[test]')")

from mlflow import MlflowClient
from mlflow.entities import Span, Trace

pytestmark = pytest.mark.slow  # a real mlflow server (the session fixture) and its trace store

SERVICE_NAME = "otelprof-e2e"
HEADER = "x-mlflow-experiment-id"
#: MLflow does not store these resource attributes as trace tags (nor ``mlflow.*``).
SKIPPED_RESOURCE_PREFIXES = ("telemetry.sdk.", "mlflow.")
STATUS_NAMES = {Status.STATUS_CODE_UNSET: "UNSET", Status.STATUS_CODE_OK: "OK", Status.STATUS_CODE_ERROR: "ERROR"}

# --- the server (started once per session: ``mlflow_server`` in tests/conftest.py) ----------


@pytest.fixture(scope="module")
def client(mlflow_server: MlflowServer) -> MlflowClient:
    return MlflowClient(tracking_uri=mlflow_server.url)


# --- what was sent, what MLflow returns ---------------------------------------------------


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return None if kind is None else getattr(value, kind)


def _attributes(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in attributes}


def _as_mlflow_reads(value: Any) -> Any:
    """A span attribute as MLflow's client returns it: a string holding a JSON array, object or
    string comes back decoded (``sanitize_attributes``); every other value unchanged."""
    if not isinstance(value, str):
        return value
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    return decoded if isinstance(decoded, (str, list, dict)) else value


def _mlflow_trace_id(otel_trace_id: bytes) -> str:
    return "tr-" + otel_trace_id.hex()


@dataclass(frozen=True)
class SentSpan:
    span: OtlpSpan
    resource: dict[str, Any]

    @property
    def attributes(self) -> dict[str, Any]:
        return _attributes(self.span.attributes)


@dataclass(frozen=True)
class Delivery:
    """One experiment: the spans sent to it (decoded) and the traces MLflow's client returns."""

    experiment_id: str
    requests: list[bytes]
    sent: dict[str, SentSpan]  # by span id (hex)
    traces: dict[str, Trace]  # by MLflow trace id ("tr-" + OTel trace id in hex)

    @property
    def spans(self) -> dict[str, Span]:
        return {s.span_id: s for trace in self.traces.values() for s in trace.data.spans}


def _decode(requests: list[bytes]) -> dict[str, SentSpan]:
    sent: dict[str, SentSpan] = {}
    for raw in requests:
        for resource_spans in ExportTraceServiceRequest.FromString(raw).resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    sent[span.span_id.hex()] = SentSpan(span, resource)
    return sent


def _read_back(client: MlflowClient, experiment_id: str) -> dict[str, Trace]:
    page = client.search_traces(locations=[experiment_id], max_results=100)
    assert page.token is None, "more traces than one page"
    return {trace.info.trace_id: trace for trace in page}


def _environ(server: MlflowServer, experiment_id: str, **more: str) -> dict[str, str]:
    """Everything otelprof needs to send to MLflow, as a deployment would set it."""
    return {
        "OTEL_SERVICE_NAME": SERVICE_NAME,
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=e2e",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": server.traces_url,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"x-mlflow-experiment-id={experiment_id}",
        **more,
    }


@pytest.fixture(scope="module")
def amd(mlflow_server: MlflowServer, client: MlflowClient) -> Delivery:
    """AMD MI250 training steps, every event a span (kernels under their launches, ``fwdbwd``
    links), sent request by request with ``otelprof.export.http.send``."""
    experiment_id = client.create_experiment("otelprof-amd-mi250")
    environ = _environ(mlflow_server, experiment_id)
    result = convert(shared_trace("amd_trace"), options=options_from_env(environ, detail="full"))
    cfg = exporter_config_from_env(environ)
    assert (cfg.protocol, cfg.url, cfg.header_names) == ("http/protobuf", mlflow_server.traces_url, (HEADER,))
    results = [send(cfg, request) for request in result.requests]
    assert results == [ExportResult.success()] * len(result.requests)
    return Delivery(experiment_id, result.requests, _decode(result.requests), _read_back(client, experiment_id))


@pytest.fixture(scope="module")
def bert(mlflow_server: MlflowServer, client: MlflowClient, tmp_path_factory: pytest.TempPathFactory) -> Delivery:
    """H100 inference at default detail (memory events become span events), split into small
    requests and sent gzip-compressed through the background ``Exporter``: MLflow has to join a
    trace's spans arriving in several requests."""
    experiment_id = client.create_experiment("otelprof-h100-bert")
    environ = _environ(
        mlflow_server,
        experiment_id,
        OTEL_EXPORTER_OTLP_TRACES_COMPRESSION="gzip",
        OTELPROF_MAX_REQUEST_BYTES="16384",
    )
    result = convert(shared_trace("bert-small"), options=options_from_env(environ))
    assert len(result.requests) > 1
    exporter = Exporter(
        exporter_config_from_env(environ),
        spool_dir=tmp_path_factory.mktemp("spool"),
        registry=CollectorRegistry(),
    )
    try:
        for request in result.requests:
            exporter.submit(request)
        assert exporter.flush(timeout_s=60.0)
    finally:
        exporter.shutdown()
    counters = exporter.counters
    assert (counters.requests_exported, counters.requests_spooled, counters.requests_dropped) == (
        len(result.requests),
        0,
        0,
    )
    assert counters.spans_rejected == 0
    assert exporter.spool.records() == []
    return Delivery(experiment_id, result.requests, _decode(result.requests), _read_back(client, experiment_id))


@pytest.fixture(params=["amd", "bert"])
def delivery(request: pytest.FixtureRequest) -> Delivery:
    result: Delivery = request.getfixturevalue(request.param)
    return result


# --- the tests ----------------------------------------------------------------------------


def test_every_trace_and_span_arrives(delivery: Delivery) -> None:
    sent_by_trace: dict[str, set[str]] = defaultdict(set)
    for span_id, sent in delivery.sent.items():
        sent_by_trace[_mlflow_trace_id(sent.span.trace_id)].add(span_id)
    got_by_trace = {trace_id: {s.span_id for s in trace.data.spans} for trace_id, trace in delivery.traces.items()}
    assert got_by_trace == sent_by_trace
    assert len(delivery.spans) == len(delivery.sent)
    assert all(trace.info.experiment_id == delivery.experiment_id for trace in delivery.traces.values())


def test_spans_read_back_field_by_field(delivery: Delivery) -> None:
    spans = delivery.spans
    for span_id, sent in delivery.sent.items():
        otlp, got = sent.span, spans[span_id]
        trace_id = _mlflow_trace_id(otlp.trace_id)
        assert otlp.kind == OtlpSpan.SPAN_KIND_INTERNAL  # MLflow keeps no kind: INTERNAL is its default
        assert (got.trace_id, got.name, got.start_time_ns, got.end_time_ns) == (
            trace_id,
            otlp.name,
            otlp.start_time_unix_nano,
            otlp.end_time_unix_nano,
        )
        assert got.parent_id == (otlp.parent_span_id.hex() if otlp.parent_span_id else None)
        assert got.status.status_code.value == STATUS_NAMES[otlp.status.code]
        attributes = dict(got.attributes)
        added = {key: attributes.pop(key) for key in list(attributes) if key.startswith("mlflow.")}
        expected = {"mlflow.traceRequestId": trace_id}
        for key, otel_key in (("mlflow.spanInputs", "input.value"), ("mlflow.spanOutputs", "output.value")):
            if otel_key in sent.attributes:  # a step's OpenInference input/output, as MLflow's own
                expected[key] = json.loads(sent.attributes[otel_key])
        assert added == expected
        assert attributes == {key: _as_mlflow_reads(value) for key, value in sent.attributes.items()}
        assert [(e.name, e.timestamp, e.attributes) for e in got.events] == [
            (e.name, e.time_unix_nano, _attributes(e.attributes)) for e in otlp.events
        ]
        assert [(link.trace_id, link.span_id, link.attributes) for link in got.links] == [
            (_mlflow_trace_id(link.trace_id), link.span_id.hex(), _attributes(link.attributes)) for link in otlp.links
        ]


def test_json_string_attributes_read_back_decoded(amd: Delivery) -> None:
    """The one change of value: otelprof's "string (JSON)" attributes come back as JSON values."""
    span_id, sent = next((i, s) for i, s in amd.sent.items() if s.span.name == "aten::addmm")
    assert sent.attributes["otelprof.op.input_dims"] == "[[128],[5,128],[128,128],[],[]]"
    assert amd.spans[span_id].attributes["otelprof.op.input_dims"] == [[128], [5, 128], [128, 128], [], []]


def test_resource_attributes_become_trace_tags(delivery: Delivery) -> None:
    resources = {_mlflow_trace_id(s.span.trace_id): s.resource for s in delivery.sent.values()}
    for trace_id, trace in delivery.traces.items():
        resource = resources[trace_id]
        assert resource["service.name"] == SERVICE_NAME
        assert resource["deployment.environment.name"] == "e2e"
        assert {"telemetry.sdk.name", "otelprof.run.id"} <= resource.keys()
        kept = {
            key: value if isinstance(value, str) else json.dumps(value)
            for key, value in resource.items()
            if not key.startswith(SKIPPED_RESOURCE_PREFIXES)
        }
        tags = trace.info.tags
        assert {key: tags.get(key) for key in resource} == {key: kept.get(key) for key in resource}


def test_search_filters_on_resource_tags_and_span_names(client: MlflowClient, amd: Delivery) -> None:
    def found(filter_string: str) -> set[str]:
        page = client.search_traces(locations=[amd.experiment_id], filter_string=filter_string, include_spans=False)
        return {trace.info.trace_id for trace in page}

    assert found(f"tags.`service.name` = '{SERVICE_NAME}'") == set(amd.traces)
    assert found("tags.`service.name` = 'someone-else'") == set()
    assert found("span.name = 'aten::addmm'") == {_step_trace(amd, 1)}


def test_roots_are_the_steps_and_the_profiler_window(amd: Delivery) -> None:
    roots = {}
    for trace in amd.traces.values():
        (root,) = [s for s in trace.data.spans if s.parent_id is None]
        roots[root.name] = root.attributes.get("otelprof.step.number")
        assert trace.info.request_time == root.start_time_ns // 1_000_000
    assert roots == {"ProfilerStep#1": 1, "ProfilerStep#2": 2, "PyTorch Profiler (0)": None}


def test_an_operator_keeps_its_parent(amd: Delivery) -> None:
    spans, step_1 = amd.spans, _step_trace(amd, 1)
    (addmm,) = [s for s in spans.values() if s.name == "aten::addmm" and s.trace_id == step_1]
    expected_parent = amd.sent[addmm.span_id].span.parent_span_id.hex()
    assert addmm.parent_id == expected_parent
    parent = spans[expected_parent]
    assert (parent.name, parent.attributes["otelprof.event.category"]) == ("aten::linear", "cpu_op")
    assert parent.parent_id is not None
    assert spans[parent.parent_id].name == "ProfilerStep#1"


def _step_trace(delivery: Delivery, step: int) -> str:
    (trace_id,) = [
        trace_id
        for trace_id, trace in delivery.traces.items()
        if any(s.parent_id is None and s.name == f"ProfilerStep#{step}" for s in trace.data.spans)
    ]
    return trace_id


def test_kernels_are_children_of_their_launch(amd: Delivery) -> None:
    spans = amd.spans
    device = [s for s in spans.values() if s.attributes["otelprof.event.category"] in ("kernel", "gpu_memcpy")]
    sent_device = [s for s in amd.sent.values() if s.attributes["otelprof.event.category"] in ("kernel", "gpu_memcpy")]
    assert len(device) == len(sent_device) == 16
    for span in device:
        assert span.parent_id is not None
        launch = spans[span.parent_id]
        assert launch.trace_id == span.trace_id
        assert launch.attributes["otelprof.event.category"] in RUNTIME_CATEGORIES
        assert launch.name.startswith("hip")  # hipLaunchKernel, hipExtModuleLaunchKernel, hipMemcpyWithStream
        assert launch.attributes["otelprof.gpu.correlation_id"] == span.attributes["otelprof.gpu.correlation_id"]
        assert isinstance(span.attributes["otelprof.gpu.device"], int)
        assert isinstance(span.attributes["otelprof.gpu.stream"], int)


def test_backward_ops_link_to_their_forward_op(amd: Delivery) -> None:
    spans = amd.spans
    linked = {}
    for span in spans.values():
        for link in span.links:
            assert link.attributes == {"otelprof.link.kind": "fwdbwd"}
            assert link.trace_id == span.trace_id  # forward and backward of one step: one trace
            forward = spans[link.span_id]
            assert forward.attributes["otelprof.op.sequence_number"] == span.attributes["otelprof.op.sequence_number"]
            linked[span.name] = forward.name
    assert linked == {
        "MseLossBackward0": "aten::mse_loss",
        "ReluBackward0": "aten::relu",
        "AddmmBackward0": "aten::addmm",
        "TBackward0": "aten::t",
    }
    assert sum(len(s.span.links) for s in amd.sent.values()) == len(linked)


def test_memory_events_arrive_as_span_events(bert: Delivery) -> None:
    events = [e for s in bert.spans.values() for e in s.events]
    assert len(events) == sum(len(s.span.events) for s in bert.sent.values()) == 236
    assert {e.name for e in events} == {"otelprof.memory"}
    counts = {"bytes", "total_allocated_bytes", "total_reserved_bytes", "device_type", "device_id"}
    keys = {f"otelprof.memory.{k}" for k in (*counts, "device", "addr")}
    assert all(e.attributes.keys() == keys for e in events)
    assert all(isinstance(e.attributes[f"otelprof.memory.{k}"], int) for e in events for k in counts)
    assert {e.attributes["otelprof.memory.device"] for e in events} == {"cpu", "cuda:0"}
    assert all(str(e.attributes["otelprof.memory.addr"]).startswith("0x") for e in events)


def test_sending_a_trace_again_changes_nothing(
    mlflow_server: MlflowServer, client: MlflowClient, amd: Delivery
) -> None:
    """MLflow keys traces and spans by their ids, so a request sent twice (a retry after a lost
    response, a replayed spool) is stored once. The experiment header only places a *new* trace:
    spans of a trace MLflow already holds join it, even when the header names another experiment
    (``_log_spans_once`` looks the experiment up only for trace ids it does not know)."""
    other = client.create_experiment("otelprof-other")
    cfg = exporter_config_from_env(_environ(mlflow_server, other))
    assert [send(cfg, request) for request in amd.requests] == [ExportResult.success()] * len(amd.requests)
    assert _read_back(client, other) == {}
    again = _read_back(client, amd.experiment_id)
    assert {s.span_id: s.to_dict() for t in again.values() for s in t.data.spans} == {
        span_id: span.to_dict() for span_id, span in amd.spans.items()
    }


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param({}, "HTTP 422", id="no-experiment-header"),
        pytest.param({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"{HEADER}=step-1"}, "HTTP 400", id="malformed-experiment"),
        pytest.param({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"{HEADER}=999999"}, "HTTP 404", id="unknown-experiment"),
    ],
)
def test_without_a_valid_experiment_mlflow_refuses_for_good(
    mlflow_server: MlflowServer, headers: dict[str, str], status: str
) -> None:
    """A final (not retryable) failure: the exporter drops the request and logs MLflow's reason."""
    cfg = exporter_config_from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": mlflow_server.traces_url, **headers})
    # a run id of its own: trace ids MLflow has not seen (for those, see the test above)
    result = send(cfg, convert(shared_trace("amd_trace"), run_id="otelprof-e2e-refused").requests[0])
    assert (result.ok, result.retryable) == (False, False)
    assert result.message.startswith(status)


# --- what MLflow's trace list shows ------------------------------------------------------------


def _listed_ms(span: Span) -> float:
    """A span's duration as the trace list's JSON has it: milliseconds, three decimals, truncated."""
    assert span.start_time_ns is not None and span.end_time_ns is not None
    return (span.end_time_ns - span.start_time_ns) // 1000 / 1000


def test_a_converted_step_lists_its_number_and_duration(client: MlflowClient, amd: Delivery) -> None:
    """The trace list (``search_traces`` without spans: what MLflow's UI lists) previews a
    converted step's trace from its root's ``input.value`` / ``output.value``."""
    page = client.search_traces(locations=[amd.experiment_id], include_spans=False)
    infos = {trace.info.trace_id: trace.info for trace in page}
    for step in (1, 2):
        info = infos[_step_trace(amd, step)]
        root = next(s for s in amd.traces[info.trace_id].data.spans if s.parent_id is None)
        assert json.loads(info.request_preview) == {"step": step}
        duration_ms = _listed_ms(root)
        assert json.loads(info.response_preview) == {"step_ms": duration_ms}


@pytest.fixture(scope="module")
def live(mlflow_server: MlflowServer, client: MlflowClient, tmp_path_factory: pytest.TempPathFactory) -> Delivery:
    """A real training loop instrumented live, exporting to MLflow: eight steps of four samples,
    the early window (OTELPROF_PROFILE_EARLY=2) warming up at step 2 and recording 3 and 4."""
    pytest.importorskip("torch")
    from capture import live_session

    experiment_id = client.create_experiment("otelprof-live")
    environ = _environ(mlflow_server, experiment_id, OTELPROF_RUN_ID="mlflow-live")
    quiet = {"OTELPROF_TRIGGER_SIGNAL": "none", "OTELPROF_ANOMALY_FACTOR": "0", "OTELPROF_PROFILE_EARLY": "2"}
    session = live_session.start(free_port(), tmp_path_factory.mktemp("live-spool"), **environ, **quiet)
    live_session.train(8)
    live_session.stop(session)
    assert session.windows is not None and session.windows.windows_done == 1
    assert session.exporter is not None and session.exporter.counters.requests_spooled == 0
    return Delivery(experiment_id, [], {}, _read_back(client, experiment_id))


def test_a_live_step_lists_its_number_and_phases(client: MlflowClient, live: Delivery) -> None:
    """Each live step is one trace whose root is its ``train.step``; the list shows the step
    number and samples (request preview) and each phase's milliseconds (response preview)."""
    page = client.search_traces(locations=[live.experiment_id], include_spans=False)
    infos = {trace.info.trace_id: trace.info for trace in page}
    steps = {_mlflow_trace_id(ids.trace_id(f"step|mlflow-live|{n}")) for n in range(8)}
    # and no window trace: it would hold what ran in no step, and here nothing did (a lone root is not sent)
    assert infos.keys() == steps
    for n in range(8):
        info = infos[_mlflow_trace_id(ids.trace_id(f"step|mlflow-live|{n}"))]
        spans = live.traces[info.trace_id].data.spans
        (root,) = [s for s in spans if s.parent_id is None]
        assert root.name == "train.step"
        assert json.loads(info.request_preview) == {"step": n, "samples": 4}
        listed = json.loads(info.response_preview)
        phases = {
            s.attributes["otelprof.phase.name"]: s
            for s in spans
            if s.parent_id == root.span_id and s.name != f"ProfilerStep#{n}"
        }
        assert list(listed) == [f"{p}_ms" for p in ("data", "forward", "backward", "optimizer")] + ["step_ms"]
        for phase, span in phases.items():
            assert listed[f"{phase}_ms"] == _listed_ms(span)
        assert listed["step_ms"] == _listed_ms(root)
        assert phases["forward"].name == "forward Sequential"
        mark = root.attributes.get("otelprof.step.window")
        assert (mark, root.attributes.get("otelprof.window.trigger")) == {
            2: ("warmup", "early"),
            3: ("recorded", "early"),
            4: ("recorded", "early"),
            5: ("after", None),
        }.get(n, (None, None))
        profiled = [s for s in spans if s.name == f"ProfilerStep#{n}"]
        assert len(profiled) == (1 if n in (3, 4) else 0)  # the window's operators, under the live step
