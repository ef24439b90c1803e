"""With ``threads=2`` the build and the encoder share their work with a second thread from
``parallel_from`` events (the event tree: the CPU side's nesting beside the device side's and the
steps') or spans (the encoder: the first thread writes the first spans as one thread would and
leaves its last request open; the second measures those spans to know how full it is, writes
the spans that still fit aside, then the rest in requests of its own). The output must be one
thread's, byte for byte: the same requests split at the same spans, decoded by the official
protobuf classes.

``parallel_from=1`` splits any trace; ``split_from_bytes`` keeps the parse on one thread, so
these cases test the build and the encoder alone (tests/converter/test_split_parse.py tests the
parse).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import KINETO_TRACES, cpu_op_event, skip_unless_native

from otelprof.converter import ConvertOptions

pytestmark = pytest.mark.native

NO_PARSE_SPLIT = 1 << 62


@pytest.fixture(autouse=True)
def _need_native() -> None:
    skip_unless_native()


def _convert(data: bytes, threads: int, parallel_from: int = 1, **fields: Any) -> tuple[Any, ...]:
    """(requests, ops, stats, window id)."""
    from otelprof import _native

    options = {
        **ConvertOptions(**fields).as_native(),
        "threads": threads,
        "split_from_bytes": NO_PARSE_SPLIT,
        "parallel_from": parallel_from,
    }
    out = _native.convert(data, options)
    ops = [(o.name, o.kind, o.input_shapes, o.calls, o.cpu_total_ns, o.self_cpu_ns) for o in out.ops]
    return (list(out.requests), ops, dict(out.stats), out.window_id)


def _spans(requests: list[bytes]) -> list[Any]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return [
        span
        for data in requests
        for rs in ExportTraceServiceRequest.FromString(data).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


def _same_as_one_thread(data: bytes, **fields: Any) -> list[bytes]:
    """Asserts two threads give one thread's output, each request within the size limit; returns the requests."""
    one, two = _convert(data, 1, **fields), _convert(data, 2, **fields)
    assert len(two[0]) == len(one[0])
    assert two[0] == one[0]
    assert two[1:] == one[1:]
    limit = ConvertOptions(**fields).max_request_bytes
    for request in one[0]:
        assert len(request) <= limit or len(_spans([request])) == 1
    requests: list[bytes] = one[0]
    return requests


@pytest.mark.parametrize("max_request_bytes", [3 << 20, 20_000, 1 << 30], ids=["default", "small", "one"])
@pytest.mark.parametrize("detail", ["full", "default"])
@pytest.mark.parametrize("path", KINETO_TRACES, ids=lambda p: p.name[:60])
def test_shared_traces_convert_the_same(path: Path, detail: str, max_request_bytes: int) -> None:
    data = gzip.decompress(path.read_bytes())
    requests = _same_as_one_thread(data, detail=detail, max_request_bytes=max_request_bytes)
    stats = _convert(data, 2, detail=detail, max_request_bytes=max_request_bytes)[2]
    assert len(requests) == stats["requests"]
    payload = sum(map(len, requests))
    assert len(requests) == 1 if payload <= max_request_bytes else len(requests) > 1


_event = cpu_op_event


def _trace(events: list[Any]) -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()


def test_what_a_span_can_hold() -> None:
    # every part of a span the encoder writes, in spans on both threads' sides: long names (two-byte
    # lengths), string values longer than a request's spare room, span events, links, dropped
    # counts, empty and non-ASCII strings, negative and large integers, doubles
    long_value = "frame\u00e9 " * 3000
    events: list[dict[str, Any]] = []
    for k in range(400):
        ev = _event(k, ts=1000 + 100 * k, dur=60)
        if k % 50 == 7:
            ev["name"] = "aten::" + "long_name_" * 30
        if k % 97 == 3:
            ev["args"]["Call stack"] = long_value
        if k % 13 == 5:
            ev["args"]["Note"] = ""
            ev["args"]["Ratio"] = 0.125
            ev["args"]["Offset"] = -(2**40)
        events.append(ev)
        if k % 9 == 0:  # memory events inside the op: span events (some dropped past the limit)
            for j in range(4):
                args = {"Total Allocated": k + j, "Bytes": 2**33 + j}
                memory = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": ev["tid"]}
                events.append({**memory, "ts": ev["ts"] + 1 + j, "args": args})
        if k % 11 == 0 and k + 22 < 400:  # forward to backward links
            flow = {"cat": "fwdbwd", "id": k, "pid": 1, "name": "fwdbwd"}
            events.append({**flow, "ph": "s", "tid": ev["tid"], "ts": ev["ts"] + 2})
            events.append({**flow, "ph": "f", "bp": "e", "tid": 2 + (k + 22) % 3, "ts": 1000 + 100 * (k + 22) + 2})
    data = _trace(events)
    for detail, limit in [("full", 3 << 20), ("full", 30_000), ("full", 4_000), ("default", 4_000)]:
        fields: dict[str, Any] = {
            "detail": detail,
            "max_request_bytes": limit,
            "attribute_value_length_limit": None,
            "event_limit": 3,
        }
        requests = _same_as_one_thread(data, span_budget=0, **fields)
        spans = _spans(requests)
        assert len(spans) == _convert(data, 1, span_budget=0, **fields)[2]["spans"] > 400
        values = [kv.value.string_value for s in spans for kv in s.attributes]
        assert values.count(long_value) == len(range(3, 400, 97)), "long values are written whole"
        assert sum(len(s.events) for s in spans) == (4 if detail == "full" else 3) * len(range(0, 400, 9))
        assert sum(s.dropped_events_count for s in spans) == (0 if detail == "full" else len(range(0, 400, 9)))
        assert sum(len(s.links) for s in spans) == len(range(0, 378, 11))
        assert any(len(s.name) > 127 for s in spans)
        if limit == 4_000:
            assert any(len(r) > limit for r in requests), "a span larger than a request goes alone"
    # values cut to a length limit: the same cuts on either side
    requests = _same_as_one_thread(data, detail="full", attribute_value_length_limit=100)
    values = [kv.value.string_value for s in _spans(requests) for kv in s.attributes]
    assert values.count(long_value[:100]) == len(range(3, 400, 97))
    long_names = len(range(7, 400, 50))  # a cut name's whole in otelprof.event.name, cut at 100 too
    assert (
        _convert(data, 2, detail="full", attribute_value_length_limit=100)[2]["values_truncated"]
        == values.count(long_value[:100]) + long_names
    )


@pytest.mark.parametrize("at", [[5], [390], [5, 200, 390]], ids=["first side", "second side", "both"])
def test_spans_past_a_requests_buffer_grow_their_own(at: list[int]) -> None:
    # a value longer than a request's buffer has room for (the request limit and 64 KiB) grows
    # the buffer being written, while the other thread has buffers of its own open
    big = "y" * 150_000
    events = [_event(k, ts=1000 + 100 * k, dur=60) for k in range(400)]
    for k in at:
        events[k]["args"]["Call stack"] = big
    requests = _same_as_one_thread(
        _trace(events), detail="full", max_request_bytes=4_000, attribute_value_length_limit=None
    )
    values = [kv.value.string_value for s in _spans(requests) for kv in s.attributes]
    assert values.count(big) == len(at)
    assert sum(len(r) > 150_000 for r in requests) == len(at), "each alone in its request"
