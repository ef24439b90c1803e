"""A profiling window's requests carry the live session's resource, so a step's window spans
and its ``train.step`` span describe the same process (``process.pid``,
``pytorch.distributed.local_rank``, ``telemetry.sdk.version`` ...).

The converter builds a window's resource from the trace (host, rank, world size, backend, GPU
model); its string-only options cannot carry the session's integer attributes. Here each
request's ``Resource`` is replaced, on the conversion thread, by the session's attributes
followed by those the trace adds that the session has none of (``hw.gpu.model``,
``pytorch.distributed.backend``). Only the resource is rewritten: the spans' bytes are copied as
they are (no decoding).
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ...otlp.encoder import attributes
from ...otlp.file import decode_varint, encode_varint
from ...otlp.spans import Attrs

#: Bytes a window request may grow by: ConvertOptions.max_request_bytes is lowered by this much
#: plus the session resource's size, so rewritten requests stay under the configured limit.
MARGIN = 64


def _fields(data: bytes) -> list[tuple[int, bytes]]:
    """The length-delimited fields of a message whose fields all are (requests, ResourceSpans)."""
    out: list[tuple[int, bytes]] = []
    i = 0
    while i < len(data):
        tag = data[i]
        if tag & 7 != 2:
            raise ValueError(f"unexpected wire type in tag {tag:#x}")
        n, i = decode_varint(data, i + 1)
        out.append((tag, data[i : i + n]))
        i += n
    return out


def _field(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + encode_varint(len(payload)) + payload


class LiveResource:
    """Rewrites window requests' resource to the session's (``apply``)."""

    def __init__(self, resource: Attrs) -> None:
        self._attrs = attributes(resource)
        self._keys = {k for k, _v in resource}
        self.size = len(Resource(attributes=self._attrs).SerializeToString(deterministic=True))
        self._cache: dict[bytes, bytes] = {}

    def resource(self, window: bytes) -> bytes:
        """The session's resource with the window's own extra attributes after it."""
        cached = self._cache.get(window)
        if cached is None:
            old = Resource.FromString(window)
            extra = [kv for kv in old.attributes if kv.key not in self._keys]
            cached = Resource(
                attributes=[*self._attrs, *extra], dropped_attributes_count=old.dropped_attributes_count
            ).SerializeToString(deterministic=True)
            if len(self._cache) < 16:
                self._cache[window] = cached
        return cached

    def apply(self, request: bytes) -> bytes:
        out = bytearray()
        for tag, resource_spans in _fields(request):
            if tag != 0x0A:  # ExportTraceServiceRequest has resource_spans only
                out += _field(tag, resource_spans)
                continue
            parts = [
                _field(0x0A, self.resource(payload)) if inner == 0x0A else _field(inner, payload)
                for inner, payload in _fields(resource_spans)
            ]
            out += _field(0x0A, b"".join(parts))
        return bytes(out)

    def submit(self, submit: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """``submit`` with each request's resource rewritten first."""

        def rewritten(request: bytes) -> None:
            submit(self.apply(request))

        return rewritten
