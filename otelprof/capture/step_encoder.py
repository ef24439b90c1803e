"""Step spans -> ``ExportTraceServiceRequest`` bytes, written directly in protobuf wire format.

Step spans have a fixed shape (ids, name, times, a few scalar attributes; no events or links),
so writing their bytes by hand is about 3x faster than building the official message classes
(benchmarked in tests/capture/test_step_encoder.py's docstring), and the encoding thread holds
the GIL for that much less time beside the training loop. The output is byte-identical to the
reference encoder (official opentelemetry-proto classes, deterministic serialization), request
splitting included; the tests compare the two.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from ..otlp import encoder as reference
from ..otlp._text import clean
from ..otlp.spans import Attrs, Span

_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_KIND_INTERNAL = b"\x30\x01"


_SMALL = [bytes((i,)) for i in range(0x80)]


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64  # int64: two's complement, ten bytes
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _any_value(value: object) -> bytes:
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"  # a oneof member is written even when false
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    return _field(b"\x0a", clean(str(value)).encode())


class StepEncoder:
    """Encodes spans without events or links; anything else goes to the reference encoder."""

    def __init__(self, resource: Attrs, scope_version: str) -> None:
        self._resource_pb = reference.Resource(attributes=reference.attributes(resource))
        self._scope_pb = reference.InstrumentationScope(name=reference.SCOPE_NAME, version=clean(scope_version))
        self._resource = self._resource_pb.SerializeToString(deterministic=True)
        self._scope = self._scope_pb.SerializeToString(deterministic=True)
        self._attr_cache: dict[tuple[str, object], bytes] = {}

    def encode(self, spans: list[Span], max_bytes: int) -> list[bytes]:
        requests: list[bytes] = []
        batch: list[bytes] = []
        body = 0
        scope_field = reference.field_len(len(self._scope))
        resource_field = reference.field_len(len(self._resource))
        for sp in spans:
            data = self._span(sp)
            extra = reference.field_len(len(data))
            if batch:
                scope_spans = scope_field + body + extra
                if reference.field_len(resource_field + reference.field_len(scope_spans)) > max_bytes:
                    requests.append(self._request(batch))
                    batch, body = [], 0
            batch.append(data)
            body += extra
        if batch:
            requests.append(self._request(batch))
        return requests

    def _request(self, spans: Iterable[bytes]) -> bytes:
        scope_spans = _field(b"\x0a", self._scope) + b"".join(_field(b"\x12", s) for s in spans)
        resource_spans = _field(b"\x0a", self._resource) + _field(b"\x12", scope_spans)
        return _field(b"\x0a", resource_spans)

    def _span(self, sp: Span) -> bytes:
        if sp.events or sp.links or sp.dropped_events or sp.dropped_links:
            return reference.span_message(sp).SerializeToString(deterministic=True)
        trace_id, span_id, parent_id = sp.trace_id, sp.span_id, sp.parent_id
        # the usual sizes have their tag and length as one constant
        parts = [
            b"\x0a\x10" + trace_id if len(trace_id) == 16 else _field(b"\x0a", trace_id),
            b"\x12\x08" + span_id if len(span_id) == 8 else _field(b"\x12", span_id),
        ]
        if parent_id:
            parts.append(b"\x22\x08" + parent_id if len(parent_id) == 8 else _field(b"\x22", parent_id))
        if sp.name:  # proto3 leaves out fields at their default
            parts.append(_field(b"\x2a", clean(sp.name).encode()))
        parts.append(_KIND_INTERNAL)
        if sp.start:
            parts.append(b"\x39" + _FIXED64.pack(sp.start))
        if sp.end:
            parts.append(b"\x41" + _FIXED64.pack(sp.end))
        cache = self._attr_cache
        for key, value in sp.attrs:
            cached = cache.get((key, value)) if isinstance(value, str) else None
            if cached is None:
                kv = _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))
                cached = _field(b"\x4a", kv)
                if isinstance(value, str) and len(cache) < 1024:
                    cache[(key, value)] = cached
            parts.append(cached)
        return b"".join(parts)
