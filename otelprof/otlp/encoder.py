"""Spans -> ``ExportTraceServiceRequest`` bytes through the official opentelemetry-proto
classes, split so no request exceeds ``max_request_bytes`` (the oracle for the native encoder,
``native/src/encoder.cpp``, and for the live step encoders).
"""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from ._text import clean
from .spans import Attrs, Span

SCOPE_NAME = "otelprof"


def _value(value: object) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=clean(str(value)))


def attributes(attrs: Attrs) -> list[KeyValue]:
    """``KeyValue`` messages of attributes, in order (strings cleaned of lone surrogates)."""
    return [KeyValue(key=k, value=_value(v)) for k, v in attrs]


def span_message(sp: Span) -> PbSpan:
    """The ``Span`` message of one span (its memory events named ``otelprof.memory``)."""
    out = PbSpan(
        trace_id=sp.trace_id,
        span_id=sp.span_id,
        parent_span_id=sp.parent_id,
        name=clean(sp.name),
        kind=PbSpan.SPAN_KIND_INTERNAL,
        start_time_unix_nano=sp.start,
        end_time_unix_nano=sp.end,
        attributes=attributes(sp.attrs),
        dropped_events_count=sp.dropped_events,
        dropped_links_count=sp.dropped_links,
    )
    for ts, _ordinal, attrs in sp.events:
        out.events.add(time_unix_nano=ts, name="otelprof.memory", attributes=attributes(attrs))
    for trace_id, span_id, attrs in sp.links:
        out.links.add(trace_id=trace_id, span_id=span_id, attributes=attributes(attrs))
    return out


def _varint_len(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def field_len(n: int) -> int:
    """Bytes taken by a length-delimited field (1-byte tag) holding ``n`` bytes."""
    return 1 + _varint_len(n) + n


def encode(spans: list[Span], resource: Attrs, scope_version: str, max_bytes: int) -> list[bytes]:
    """Requests holding ``spans`` in order under one resource and scope, each at most
    ``max_bytes`` long unless a single span is larger."""
    res = Resource(attributes=attributes(resource))
    scope = InstrumentationScope(name=SCOPE_NAME, version=clean(scope_version))
    requests: list[bytes] = []
    batch: list[PbSpan] = []
    body = 0  # bytes of the spans fields inside ScopeSpans

    def size_with(extra: int) -> int:
        scope_spans = field_len(scope.ByteSize()) + body + extra
        resource_spans = field_len(res.ByteSize()) + field_len(scope_spans)
        return field_len(resource_spans)

    def flush() -> None:
        request = ExportTraceServiceRequest(
            resource_spans=[ResourceSpans(resource=res, scope_spans=[ScopeSpans(scope=scope, spans=batch)])]
        )
        requests.append(request.SerializeToString(deterministic=True))

    for sp in spans:
        pb = span_message(sp)
        extra = field_len(pb.ByteSize())
        if batch and size_with(extra) > max_bytes:
            flush()
            batch, body = [], 0
        batch.append(pb)
        body += extra
    if batch:
        flush()
    return requests


__all__ = [
    "SCOPE_NAME",
    "InstrumentationScope",
    "Resource",
    "attributes",
    "encode",
    "field_len",
    "span_message",
]
