"""OTLP/JSON: ``ExportTraceServiceRequest`` bytes <-> the JSON the OpenTelemetry Collector reads.

OTLP/JSON is protobuf's canonical JSON mapping with three differences (OTLP specification,
"JSON Protobuf Encoding"): trace and span ids are lowercase hex rather than base64, enum values
are integers, and field names are lowerCamelCase. A file with one request per line is what the
Collector's ``otlpjsonfile`` receiver reads.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_SPAN_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
_LINK_ID_FIELDS = ("traceId", "spanId")


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"id {value!r} is not hex") from None
    return base64.b64encode(raw).decode("ascii")


def _map_ids(doc: dict[str, Any], convert: Callable[[str], str]) -> None:
    for resource_spans in doc.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for key in _SPAN_ID_FIELDS:
                    if key in span:
                        span[key] = convert(span[key])
                for link in span.get("links", ()):
                    for key in _LINK_ID_FIELDS:
                        if key in link:
                            link[key] = convert(link[key])


def request_to_dict(data: bytes) -> dict[str, Any]:
    """A serialized ``ExportTraceServiceRequest`` as an OTLP/JSON object."""
    request = ExportTraceServiceRequest.FromString(data)
    doc = json_format.MessageToDict(request, use_integers_for_enums=True)
    _map_ids(doc, _b64_to_hex)
    return doc


def request_to_json(data: bytes) -> str:
    """A serialized ``ExportTraceServiceRequest`` as compact OTLP/JSON on one line."""
    return json.dumps(request_to_dict(data), separators=(",", ":"), ensure_ascii=False)


def json_to_request(text: str | bytes) -> bytes:
    """The inverse of :func:`request_to_json`: OTLP/JSON text -> serialized request bytes."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("an OTLP/JSON request must be a JSON object")
    _map_ids(doc, _hex_to_b64)
    request = json_format.ParseDict(doc, ExportTraceServiceRequest())
    return request.SerializeToString(deterministic=True)


def encode_jsonl(requests: Iterable[bytes]) -> Iterable[bytes]:
    """One UTF-8 line (newline-terminated) of OTLP/JSON per request."""
    for data in requests:
        yield request_to_json(data).encode("utf-8") + b"\n"


__all__ = ["encode_jsonl", "json_to_request", "request_to_dict", "request_to_json"]
