"""Length-delimited OTLP files and OTLP/JSON, checked against the protobuf library itself."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otelprof.otlp.file import (
    atomic_writer,
    encode_varint,
    iter_delimited,
    read_delimited_file,
    write_delimited,
    write_delimited_file,
)
from otelprof.otlp.jsonl import json_to_request, request_to_dict, request_to_json


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_varint_matches_protobuf(value: int) -> None:
    assert encode_varint(value) == _VarintBytes(value)
    assert _DecodeVarint(encode_varint(value), 0) == (value, len(encode_varint(value)))


def test_negative_varint_raises() -> None:
    with pytest.raises(ValueError):
        encode_varint(-1)


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_delimited_round_trip(messages: list[bytes]) -> None:
    stream = io.BytesIO()
    written = write_delimited(stream, messages)
    data = stream.getvalue()
    assert written == len(data)
    assert list(iter_delimited(data)) == messages


@pytest.mark.parametrize("data", [b"\x05abc", b"\x80", b"\xff" * 11, b"\x01a\x02b"])
def test_truncated_stream_raises(data: bytes) -> None:
    with pytest.raises(ValueError):
        list(iter_delimited(data))


def test_delimited_file_is_what_protobuf_parses(tmp_path: Path) -> None:
    requests = []
    for i in range(3):
        req = ExportTraceServiceRequest()
        span = req.resource_spans.add().scope_spans.add().spans.add()
        span.name = f"span-{i}" * (i * 100 + 1)  # sizes needing 1- and 2-byte prefixes
        span.trace_id, span.span_id = bytes(range(16)), bytes([i + 1] * 8)
        requests.append(req.SerializeToString())
    path = tmp_path / "out.otlp"
    assert write_delimited_file(path, requests) == path.stat().st_size
    data, pos, parsed = path.read_bytes(), 0, []
    while pos < len(data):  # protobuf's own varint decoder, as parseDelimitedFrom does
        size, pos = _DecodeVarint(data, pos)
        parsed.append(ExportTraceServiceRequest.FromString(data[pos : pos + size]))
        pos += size
    assert [p.SerializeToString() for p in parsed] == requests
    assert read_delimited_file(path) == requests


def test_atomic_writer_replaces_only_on_success(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(path) as stream:
        stream.write(b"partial")
        raise RuntimeError("boom")
    assert path.read_bytes() == b"old"
    with atomic_writer(path) as stream:
        stream.write(b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def _request_with_link() -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "svc"
    ss = rs.scope_spans.add()
    ss.scope.name = "otelprof"
    span = ss.spans.add(
        trace_id=bytes.fromhex("0af7651916cd43dd8448eb211c80319c"),
        span_id=bytes.fromhex("b7ad6b7169203331"),
        parent_span_id=bytes.fromhex("00f067aa0ba902b7"),
        name="aten::mm",
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=1_700_000_000_000_000_000,
        end_time_unix_nano=1_700_000_000_000_050_000,
    )
    span.attributes.add(key="bytes").value.bytes_value = b"\x00\xff"
    span.links.add(trace_id=bytes(range(16)), span_id=bytes(range(8)))
    return req.SerializeToString(deterministic=True)


def test_otlp_json_encoding() -> None:
    doc = request_to_dict(_request_with_link())
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert span["spanId"] == "b7ad6b7169203331"
    assert span["parentSpanId"] == "00f067aa0ba902b7"
    assert span["links"] == [{"traceId": "000102030405060708090a0b0c0d0e0f", "spanId": "0001020304050607"}]
    assert span["kind"] == 1
    assert span["startTimeUnixNano"] == "1700000000000000000"
    assert span["attributes"] == [{"key": "bytes", "value": {"bytesValue": "AP8="}}]  # bytes values stay base64


def test_otlp_json_round_trip() -> None:
    data = _request_with_link()
    text = request_to_json(data)
    assert "\n" not in text and json.loads(text) == request_to_dict(data)
    assert json_to_request(text) == data


def test_json_to_request_rejects_bad_ids() -> None:
    with pytest.raises(ValueError):
        json_to_request('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"xyz"}]}]}]}')
    with pytest.raises(ValueError):
        json_to_request("[]")
