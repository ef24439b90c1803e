"""A window request's resource rewritten to the live session's (capture/windows/resource.py):
the session's attributes, then the trace's own extras; the spans untouched."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof.capture.windows.resource import MARGIN, LiveResource
from otelprof.otlp.encoder import encode
from otelprof.otlp.spans import Attrs, Span

WINDOW: Attrs = [("service.name", "svc"), ("pytorch.distributed.rank", 1), ("hw.gpu.model", "H100")]
LIVE: Attrs = [("service.name", "svc"), ("process.pid", 4242), ("pytorch.distributed.rank", 1), ("x.ok", True)]


def _spans(n: int) -> list[Span]:
    return [Span(i, b"t" * 16, bytes([i + 1]) * 8, b"", f"op{i}", 10 + i, 20 + i, [("k", i)]) for i in range(n)]


def _attrs(request: ExportTraceServiceRequest) -> list[list[tuple[str, str]]]:
    return [[(kv.key, str(kv.value)) for kv in rs.resource.attributes] for rs in request.resource_spans]


def test_the_session_resource_then_the_traces_extras() -> None:
    live = LiveResource(LIVE)
    requests = encode(_spans(40), WINDOW, "1.0", 2_000)
    assert len(requests) > 1
    expected = encode(_spans(40), [*LIVE, ("hw.gpu.model", "H100")], "1.0", 1 << 20)
    expected_attrs = _attrs(ExportTraceServiceRequest.FromString(expected[0]))
    spans: list[str] = []
    for raw in requests:
        rewritten = live.apply(raw)
        assert len(rewritten) <= len(raw) + live.size + MARGIN
        request = ExportTraceServiceRequest.FromString(rewritten)
        assert _attrs(request) == expected_attrs
        original = ExportTraceServiceRequest.FromString(raw)
        assert [ss.SerializeToString() for rs in request.resource_spans for ss in rs.scope_spans] == [
            ss.SerializeToString() for rs in original.resource_spans for ss in rs.scope_spans
        ]
        spans.extend(s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
    assert spans == [f"op{i}" for i in range(40)]
