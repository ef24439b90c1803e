"""The native core and the Python reference produce the same OTLP messages, ops and stats.

Runs only when ``otelprof._native`` is built (and fails instead of skipping when
``OTELPROF_REQUIRE_NATIVE`` is set).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import (
    KINETO_TRACES,
    all_spans_pb,
    convert_cached,
    decode_requests,
    reference_skips_default,
    shared_trace,
    skip_unless_native,
    trace_id_for,
)

from otelprof.converter import ConvertOptions, ConvertResult, convert
from otelprof.converter._options import Detail

pytestmark = pytest.mark.native

_BIG_FILE_BYTES = 500_000


@pytest.fixture(autouse=True)
def _need_native() -> None:
    skip_unless_native()


def _describe_difference(native: ConvertResult, reference: ConvertResult) -> str:
    """A readable account of the first difference (the full messages are too big to print)."""
    a, b = decode_requests(native.requests), decode_requests(reference.requests)
    if len(a) != len(b):
        return f"{len(a)} native requests vs {len(b)} reference"
    for k, (ma, mb) in enumerate(zip(a, b, strict=True)):
        ra, rb = ma.resource_spans[0], mb.resource_spans[0]
        if ra.resource != rb.resource:
            return f"request {k}: resource differs:\n{ra.resource}\nvs\n{rb.resource}"
        if ra.scope_spans[0].scope != rb.scope_spans[0].scope:
            return f"request {k}: scope differs"
    sa, sb = all_spans_pb(native.requests), all_spans_pb(reference.requests)
    if len(sa) != len(sb):
        return f"{len(sa)} native spans vs {len(sb)} reference"
    for k, (x, y) in enumerate(zip(sa, sb, strict=True)):
        if x != y:
            return f"span {k} ({y.name!r}) differs:\nnative:\n{x}\nreference:\n{y}"
    return "requests differ only in how spans are split between them"


def _assert_same(native: ConvertResult, reference: ConvertResult) -> None:
    assert native.engine == "native" and reference.engine == "reference"
    same = decode_requests(native.requests) == decode_requests(reference.requests)
    assert same, _describe_difference(native, reference)
    assert native.requests == reference.requests, "equal messages but different bytes (field order/encoding)"
    assert native.stats == reference.stats
    assert native.ops == reference.ops


def _params() -> list[Any]:
    out = []
    for p in KINETO_TRACES:
        big = p.stat().st_size > _BIG_FILE_BYTES
        for detail in ("full", "default"):
            if detail == "default" and reference_skips_default(p):
                continue  # this big trace runs through the reference once, at full detail
            marks = [pytest.mark.slow] if big else []
            out.append(pytest.param(p, detail, id=f"{trace_id_for(p)}-{detail}", marks=marks))
    return out


@pytest.mark.parametrize("path,detail", _params())
def test_shared_trace_matches_reference(path: Path, detail: str) -> None:
    native = convert_cached(path, "native", detail=detail)
    reference = convert_cached(path, "reference", detail=detail)
    _assert_same(native, reference)


OPTION_SETS: list[dict[str, Any]] = [
    {"detail": "default", "max_request_bytes": 16 * 1024},
    {"detail": "full", "run_id": "run-7", "rank": 3, "world_size": 16},
    {"detail": "full", "split_world_size": 0, "world_size": 1024},
    {"detail": "default", "min_duration_ns": 0},
    {"detail": "default", "min_duration_ns": 1_000_000, "event_limit": 2, "link_limit": 1},
    {"detail": "default", "event_limit": 0, "link_limit": 0},
    {"detail": "full", "group_by_input_shapes": True},
    {
        "detail": "default",
        "resource_attributes": (("service.name", "trainer"), ("deployment.environment", "ci"), ("ünï", "cödé")),
        "host_name": "node-1",
        "scope_version": "9.9.9",
    },
    {"detail": "full", "base_time_ns": 1_700_000_000_000_000_000},
]
OPTION_TRACES = ["amd_trace__mi250", "cpu_only__rank-34", "dlrm_kineto__worker1", "h100__gaunernst"]


@pytest.mark.parametrize("fragment", OPTION_TRACES)
@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(sorted(o)))
def test_options_match_reference(fragment: str, options: dict[str, Any]) -> None:
    path = shared_trace(fragment)
    _assert_same(convert(path, engine="native", **options), convert(path, engine="reference", **options))


def test_auto_engine_is_native() -> None:
    path = shared_trace("cpu_only__rank-34")
    result = convert(path, detail="full")
    assert result.engine == "native"
    assert result.requests == convert_cached(path, "reference", detail="full").requests


def _live_steps(path: Path) -> tuple[Any, ...]:
    """A LiveStep per ProfilerStep of the trace, as capture/windows.py passes them: four phases
    tiling the step, one trace shared by the first two steps (steps nested under one
    application span), a repeated number and a number the trace lacks."""
    import hashlib

    from otelprof.converter import LiveStep

    def h(text: str, size: int) -> bytes:
        return hashlib.sha256(text.encode()).digest()[:size]

    found: dict[int, tuple[int, int, int]] = {}
    for s in all_spans_pb(convert_cached(path, "reference", detail="full").requests):
        if s.name.startswith("ProfilerStep#") and not s.parent_span_id:  # the step, not a namesake
            n = int(s.name.split("#")[1])
            found.setdefault(n, (n, s.start_time_unix_nano, s.end_time_unix_nano))
    steps = sorted(found.values())
    assert steps, path
    out = []
    for k, (n, start, end) in enumerate(steps):
        cuts = [start + (end - start) * q // 4 for q in range(5)]
        phases = tuple((h(f"{n}|{q}", 8), cuts[q], cuts[q + 1]) for q in range(4))
        trigger = ("early", "", "on_demand")[k % 3]  # otelprof.window.trigger on ProfilerStep#n ("": none)
        out.append(LiveStep(n, h(f"trace|{min(k, 1) if k < 2 else n}", 16), h(f"step|{n}", 8), phases, trigger))
    out.append(LiveStep(steps[0][0], h("dup", 16), h("dup", 8), trigger="anomaly"))  # the first of a number counts
    out.append(LiveStep(10**12, h("none", 16), h("none", 8)))
    return tuple(out)


@pytest.mark.parametrize("fragment", OPTION_TRACES)
@pytest.mark.parametrize("detail", ["full", "default"])
def test_live_steps_match_reference(fragment: str, detail: Detail) -> None:
    """Profiled steps under live train.step spans (one root per step trace): both engines alike;
    with split detail traces the live steps change nothing."""
    path = shared_trace(fragment)
    live = _live_steps(path)
    one = ConvertOptions(detail=detail, world_size=1, live_steps=live)  # one rank: no split detail traces
    native = convert(path, engine="native", options=one)
    _assert_same(native, convert(path, engine="reference", options=one))
    spans = all_spans_pb(native.requests)
    for step in live[:-2]:
        members = [s for s in spans if s.trace_id == step.trace_id]
        assert [s.name for s in members if not s.parent_span_id] == [], "the live span is the only root"
        markers = [s for s in members if s.name == f"ProfilerStep#{step.number}"]
        assert [s.parent_span_id for s in markers if s.parent_span_id == step.span_id] == [step.span_id]
        [marker] = [s for s in markers if s.parent_span_id == step.span_id]
        triggers = [kv.value.string_value for kv in marker.attributes if kv.key == "otelprof.window.trigger"]
        assert triggers == ([step.trigger] if step.trigger else [])
    split = ConvertOptions(detail=detail, world_size=64, split_world_size=2)
    with_live = dataclasses.replace(split, live_steps=live)
    assert convert(path, engine="native", options=with_live).requests == convert(path, options=split).requests


@pytest.mark.parametrize("detail", ["full", "default"])
def test_escaped_strings_match_reference(detail: Detail) -> None:
    """Names, categories and arg strings the parser decodes (escapes) outlive the parsed document."""
    from otelprof.converter import convert_bytes

    def event(k: int, name: str, cat: str, dur: int) -> str:
        return (
            f'{{"ph":"X","cat":"{cat}","name":"{name}","pid":1,"tid":2,"ts":{10 + k * 100},"dur":{dur},'
            f'"args":{{"Module Hierarchy":"m\\u00e9{k}\\"x\\"","Input Dims":[[1,{k}]],"kind":"K\\tind"}}}}'
        )

    events = [event(0, "ProfilerStep#1", "user_annotation", 5000)]
    events += [event(k, f"aten::mul\\u00e9{k % 3}", "cpu\\u005fop", 1 + k % 2) for k in range(1, 40)]
    events += [event(k, "void k\\u003cfloat\\u003e(int)", "ker\\u006eel", 3) for k in range(40, 45)]
    data = ('{"traceEvents":[' + ",".join(events) + "]}").encode()
    options = ConvertOptions(detail=detail)
    _assert_same(convert_bytes(data, options, engine="native"), convert_bytes(data, options, engine="reference"))


def _batch_edges_trace() -> bytes:
    """Spans for the in-place writer, which leaves room for a full batch's header before the
    spans: full batches, a span cut to fit a request, and a short batch whose lengths take
    shorter varints than a full one's (its spans move to meet its header)."""
    events: list[dict[str, Any]] = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"aten::op{i}",
            "pid": 1,
            "tid": 1,
            "ts": 10 * i,
            "dur": 5,
            "args": {"External id": i},
        }
        for i in range(40)
    ]
    huge = {f"note {k}": chr(ord("a") + k) * 8000 for k in range(20)}  # 160 KB of attribute values
    events.append(
        {"ph": "X", "cat": "cpu_op", "name": "aten::huge", "pid": 1, "tid": 1, "ts": 500, "dur": 5, "args": huge}
    )
    events.append({"ph": "X", "cat": "cpu_op", "name": "z", "pid": 1, "tid": 1, "ts": 600, "dur": 5})
    return json.dumps({"traceEvents": events}).encode()


@pytest.mark.parametrize("max_bytes", [1024, 100_000, 3 * 1024 * 1024])
def test_requests_written_in_place_match_reference(max_bytes: int) -> None:
    data = _batch_edges_trace()
    opts = ConvertOptions(detail="full", max_request_bytes=max_bytes)
    native = convert(data, options=opts, engine="native")
    reference = convert(data, options=opts, engine="reference")
    _assert_same(native, reference)
    assert max(map(len, native.requests)) <= max_bytes
    if max_bytes == 1024:  # full batches, each closed by the span that overflows it
        assert len(native.requests) > 10
    else:  # one short batch: its lengths take 2-byte varints, a full batch's 3 or 4
        assert len(native.requests) == 1
        assert decode_requests(native.requests)[0].resource_spans[0].scope_spans[0].ByteSize() < 16384


@pytest.mark.slow
def test_a_request_over_its_preallocated_buffer() -> None:
    """One request of over 64 MiB (max_request_bytes above the 64 MiB a request's buffer is
    opened with): the bytes object grows while the spans are written into it, and its spans
    are those the same trace gives in 3 MiB requests."""
    name = "x" * 2000
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"{name}{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5}
        for i in range(36_000)
    ]
    data = json.dumps({"traceEvents": events}).encode()
    big = convert(data, engine="native", detail="full", max_request_bytes=128 << 20)
    assert len(big.requests) == 1 and len(big.requests[0]) > 64 << 20
    small = convert(data, engine="native", detail="full", max_request_bytes=3 << 20)
    assert len(small.requests) > 20
    assert all_spans_pb(big.requests) == all_spans_pb(small.requests)
