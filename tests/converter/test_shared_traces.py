"""The span model, checked on every real trace under ../shared/traces/kineto.

Expectations are computed from the raw JSON here (independently of the converter), and the
converter's output is decoded with opentelemetry-proto. Each (engine, trace) pair converts
once per detail level; fixtures are module-scoped so pytest groups the tests by trace.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import (
    DEVICE_CATEGORIES,
    KINETO_TRACES,
    LAUNCHED_CATEGORIES,
    RUNTIME_CATEGORIES,
    Decoded,
    RawTrace,
    all_spans_pb,
    convert_cached,
    decode,
    fwdbwd_pairs,
    load_raw,
    micros_to_ns,
    reference_skips_default,
    shared_trace,
    trace_id_for,
)

from otelprof.converter import convert
from otelprof.otlp.names import fold_kernel_name
from otelprof.otlp.schema import CATEGORY_KIND, Kind

if not KINETO_TRACES:  # pragma: no cover - the shared folder is part of the workspace
    pytest.skip("no shared Kineto traces found", allow_module_level=True)

DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024
_BIG_FILE_BYTES = 500_000


def _trace_params() -> list[Any]:
    return [
        pytest.param(p, id=trace_id_for(p), marks=[pytest.mark.slow] if p.stat().st_size > _BIG_FILE_BYTES else [])
        for p in KINETO_TRACES
    ]


@pytest.fixture(scope="module", params=_trace_params())
def trace(request: pytest.FixtureRequest) -> Path:
    return Path(request.param)


@pytest.fixture(scope="module")
def raw(trace: Path) -> RawTrace:
    return load_raw(trace)


@pytest.fixture(scope="module")
def full(trace: Path, engine: str) -> Decoded:
    return decode(convert_cached(trace, engine, detail="full"))


def _skip_big_reference(trace: Path, engine: str, what: str) -> None:
    """The slowest traces go through the reference engine once (full detail) only."""
    if engine == "reference" and reference_skips_default(trace):
        pytest.skip(f"the reference engine converts this big trace at full detail only; {what} runs on native")


def _ident(value: Any) -> Any:
    """pid/tid as the span model normalises them: canonical decimal strings become ints."""
    if isinstance(value, str) and value.lstrip("-").isdigit() and str(int(value)) == value:
        return int(value)
    return "" if value is None else value


# --- (a) one span per complete event --------------------------------------------------------


def test_one_span_per_complete_event(raw: RawTrace, full: Decoded) -> None:
    complete = list(raw.complete())
    real = [s for s in full.spans if not s.synthetic]
    assert len(real) == len(complete)
    assert full.result.stats["complete_events"] == len(complete)
    assert full.result.stats["spans"] == len(full.spans)
    assert full.result.stats["synthetic_spans"] == len(full.spans) - len(real)
    assert full.result.stats["aggregate_spans"] == 0
    assert full.result.stats["dropped_python"] == full.result.stats["dropped_short"] == 0
    # every event maps to exactly its span (the id is a function of the event's ordinal)
    for ordinal, e in complete:
        span = full.span_of_event(ordinal)
        assert span is not None, f"event {ordinal} ({e.get('name')}) has no span"
        assert not span.synthetic
        assert span.event_name == e.get("name", "")
        kernel = CATEGORY_KIND.get(e.get("cat", "")) == Kind.KERNEL
        shown = fold_kernel_name(span.event_name) if kernel else span.event_name
        assert span.name == (shown if len(shown) <= 128 else shown[:127] + "\N{HORIZONTAL ELLIPSIS}")
        whole = "otelprof.gpu.kernel_name" if kernel else "otelprof.event.name"
        assert (whole in span.attrs) == (span.name != span.event_name)
        assert span.category == e.get("cat", "")
    for s in full.spans:
        if s.synthetic:
            assert s.attrs["otelprof.synthetic"] is True
            assert s.category == "otelprof"
        assert s.kind == 1  # SPAN_KIND_INTERNAL
        assert len(s.trace_id) == 16 and any(s.trace_id)
        assert len(s.span_id) == 8 and any(s.span_id)
        assert s.end >= s.start


def test_resource_and_scope(raw: RawTrace, full: Decoded) -> None:
    assert full.scope_name == "otelprof"
    res = full.resource
    assert res["service.name"] == "unknown_service"
    assert res["telemetry.sdk.name"] == "otelprof"
    assert isinstance(res["otelprof.run.id"], str) and res["otelprof.run.id"]
    dist = raw.doc.get("distributedInfo") or {}
    if isinstance(dist.get("rank"), int):
        assert res["otelprof.distributed.rank"] == dist["rank"]
    else:
        assert "otelprof.distributed.rank" not in res
    if isinstance(dist.get("world_size"), int):
        assert res["otelprof.distributed.world_size"] == dist["world_size"]
    if dist.get("backend"):
        assert res["otelprof.distributed.backend"] == dist["backend"]
    props = [p for p in raw.doc.get("deviceProperties") or [] if isinstance(p, dict) and "name" in p]
    if props:
        assert res["otelprof.gpu.model"] == props[0]["name"]
        assert res["otelprof.gpu.count"] == len(props)
    else:
        assert "otelprof.gpu.model" not in res
    if isinstance(raw.doc.get("trace_id"), str):
        assert res["otelprof.run.id"] == raw.doc["trace_id"]


# --- (b) device work under the runtime call that launched it --------------------------------


def test_device_events_under_launching_runtime(raw: RawTrace, full: Decoded) -> None:
    launcher: dict[int, int] = {}
    annotation_by_ext: dict[int, int] = {}
    for ordinal, e in raw.complete():
        args = e.get("args") or {}
        if e.get("cat") in RUNTIME_CATEGORIES and isinstance(args.get("correlation"), int):
            launcher.setdefault(args["correlation"], ordinal)
        if e.get("cat") == "user_annotation" and isinstance(args.get("External id"), int):
            annotation_by_ext.setdefault(args["External id"], ordinal)
    linked = unlinked = 0
    for ordinal, e in raw.complete():
        cat = e.get("cat")
        args = e.get("args") or {}
        if cat == "gpu_user_annotation":
            if args.get("External id") not in annotation_by_ext:
                unlinked += 1
            continue
        if cat not in LAUNCHED_CATEGORIES:
            continue
        span = full.span_of_event(ordinal)
        assert span is not None
        corr = args.get("correlation")
        if corr not in launcher:
            unlinked += 1
            continue
        linked += 1
        assert span.attrs["otelprof.gpu.correlation_id"] == corr
        assert span.parent_id == full.span_id_of_event(launcher[corr]), f"{cat} {e.get('name')} corr {corr}"
        parent = full.by_id[span.parent_id]
        assert parent.category in RUNTIME_CATEGORIES
        assert parent.attrs["otelprof.gpu.correlation_id"] == corr
        assert "thread.id" not in span.attrs  # device spans sit on a stream, not a CPU thread
    assert full.result.stats["device_events_unlinked"] == unlinked
    if any(e.get("cat") in LAUNCHED_CATEGORIES for _, e in raw.complete()):
        assert linked > 0


# --- (c) forward -> backward links ----------------------------------------------------------


def _fwdbwd_links(full: Decoded) -> list[tuple[Any, Any]]:
    return [(s, lk) for s in full.spans for lk in s.links if lk.attrs.get("otelprof.link.kind") == "fwdbwd"]


def test_fwdbwd_links(raw: RawTrace, full: Decoded) -> None:
    pairs = fwdbwd_pairs(raw)
    links = _fwdbwd_links(full)
    assert full.result.stats["links"] == len(links)
    assert full.result.stats["links_dropped"] == 0
    if pairs:
        assert len(links) == len(pairs)
        # each flow binds to the op that starts where the flow point is, on its thread
        at: dict[tuple[Any, Any, Decimal], list[int]] = defaultdict(list)
        for ordinal, e in raw.complete():
            at[(_ident(e.get("pid")), _ident(e.get("tid")), Decimal(e["ts"]))].append(ordinal)
        got = {(s.span_id, lk.span_id) for s, lk in links}
        for fid, (s_ev, f_ev) in pairs.items():
            fw = {
                full.span_id_of_event(o)
                for o in at[(_ident(s_ev.get("pid")), _ident(s_ev.get("tid")), Decimal(s_ev["ts"]))]
            }
            bw = {
                full.span_id_of_event(o)
                for o in at[(_ident(f_ev.get("pid")), _ident(f_ev.get("tid")), Decimal(f_ev["ts"]))]
            }
            assert fw and bw, f"fwdbwd flow {fid}: no op at its endpoints"
            assert any((b, f) in got for b in bw for f in fw), f"fwdbwd flow {fid} has no link"
    for source, lk in links:
        target = full.by_id.get(lk.span_id)
        assert target is not None, "link target is a span of this conversion"
        assert target.trace_id == lk.trace_id
        assert target is not source
        assert "otelprof.op.sequence_number" in source.attrs
        assert target.attrs.get("otelprof.op.sequence_number") == source.attrs["otelprof.op.sequence_number"]
        assert target.start < source.start  # forward runs before its backward
        assert lk.attrs == {"otelprof.link.kind": "fwdbwd"}


# --- (d) CPU nesting, (e) parents inside the trace ------------------------------------------


def test_cpu_children_within_parents(full: Decoded) -> None:
    checked = 0
    for s in full.spans:
        if not s.parent_id or s.device:
            continue
        parent = full.by_id[s.parent_id]
        if parent.device or "thread.id" not in s.attrs or parent.attrs.get("thread.id") != s.attrs["thread.id"]:
            continue  # cross-thread parents (a step or the window root) need not contain the child
        assert parent.start <= s.start and s.end <= parent.end, f"{s.name} not inside {parent.name}"
        checked += 1
    if len(full.spans) > 100:
        assert checked > 0


def test_parents_and_link_targets_inside_own_trace(full: Decoded) -> None:
    roots = Counter(s.trace_id for s in full.roots())
    for s in full.spans:
        if s.parent_id:
            parent = full.by_id.get(s.parent_id)
            assert parent is not None, f"{s.name}: parent {s.parent_id.hex()} is not in the output"
            assert parent.trace_id == s.trace_id, f"{s.name}: parent {parent.name} is in another trace"
        for lk in s.links:
            target = full.by_id.get(lk.span_id)
            assert target is not None and target.trace_id == lk.trace_id
    # exactly one root per trace
    assert set(roots) == set(full.by_trace)
    assert all(count == 1 for count in roots.values()), roots
    # parent chains end at that root (no cycles)
    for s in full.spans:
        hops, cur = 0, s
        while cur.parent_id:
            cur = full.by_id[cur.parent_id]
            hops += 1
            assert hops <= len(full.spans)


# --- (f) default detail: kept + dropped reconcile with the input ----------------------------


def test_default_detail_reconciles(trace: Path, engine: str, raw: RawTrace) -> None:
    _skip_big_reference(trace, engine, "default detail")
    d = decode(convert_cached(trace, engine, detail="default"))
    st = d.result.stats
    complete = list(raw.complete())
    kept = st["spans"] - st["synthetic_spans"] - st["aggregate_spans"]
    hidden = st["dropped_python"] + st["dropped_short"] + st["dropped_budget"] + st["dropped_step_copies"]
    hidden += st["dropped_outside_step"]  # 0 here: no live steps
    assert kept + hidden + st["dropped_window_roots"] + st["aggregated_events"] == len(complete)
    assert st["spans"] == len(d.spans)
    assert st["synthetic_spans"] == sum(1 for s in d.spans if s.synthetic)
    assert st["dropped_python"] == sum(1 for _, e in complete if e.get("cat") == "python_function")
    assert not any(s.category == "python_function" for s in d.spans)
    aggregates = [s for s in d.spans if "otelprof.aggregated_count" in s.attrs]
    assert len(aggregates) == st["aggregate_spans"]
    assert sum(s.attrs["otelprof.aggregated_count"] for s in aggregates) == st["aggregated_events"]
    for s in aggregates:
        assert s.attrs["otelprof.aggregated_count"] >= 2
        assert (
            0 <= s.attrs["otelprof.aggregated_duration_ns"] <= (s.end - s.start) * s.attrs["otelprof.aggregated_count"]
        )
    # a short CPU-side span stays only when device work it launched is a span below it (steps and
    # the Trace window stay whatever their length)
    below: dict[bytes, list[Any]] = {}
    for s in d.spans:
        below.setdefault(s.parent_id, []).append(s)

    def launches_below(span: Any) -> bool:
        todo = list(below.get(span.span_id, []))
        while todo:
            c = todo.pop()
            if c.device or c.attrs.get("otelprof.op.self_device_time_ns"):
                return True
            todo.extend(below.get(c.span_id, []))
        return False

    for s in d.spans:
        if not s.device and not s.synthetic and "otelprof.aggregated_count" not in s.attrs:
            short = s.end - s.start < 10_000 and s.category != "Trace" and "otelprof.step.number" not in s.attrs
            # (or the budget dropped the device work it was kept for)
            over = "budget" in s.attrs.get("otelprof.hidden", "")
            assert not short or launches_below(s) or over, s.name
    recorded = sum(s.attrs.get("otelprof.hidden_spans", 0) for s in d.spans)
    window_root = any(not s.parent_id and (s.category == "Trace" or s.name == "otelprof.window") for s in d.spans)
    if window_root:
        assert recorded == hidden
    else:
        assert recorded <= hidden
    for s in d.spans:
        if "otelprof.hidden" in s.attrs:  # a sentence a person reads, agreeing with the count
            assert s.attrs["otelprof.hidden"].startswith(f"{s.attrs['otelprof.hidden_spans']} hidden (")
    for s in d.spans:  # device spans keep their launch's trace
        if s.category in LAUNCHED_CATEGORIES and s.parent_id:
            assert d.by_id[s.parent_id].trace_id == s.trace_id
    # the budget: no trace holds more than 1,000 spans
    per_trace: dict[bytes, int] = {}
    for s in d.spans:
        per_trace[s.trace_id] = per_trace.get(s.trace_id, 0) + 1
    assert max(per_trace.values(), default=0) <= 1000

    # links join the two ops they name, or what stands for a hidden one (its aggregate, or the
    # op it folds into): never a step span, both ends sent, the sequence numbers equal between
    # the ops themselves
    def stands_in(span: Any) -> bool:
        return "otelprof.aggregated_count" in span.attrs or "otelprof.hidden_spans" in span.attrs

    for s, link in _fwdbwd_links(d):
        target = d.by_id[link.span_id]
        assert "otelprof.step.number" not in s.attrs and "otelprof.step.number" not in target.attrs
        assert not s.synthetic and not target.synthetic
        seq = s.attrs.get("otelprof.op.sequence_number"), target.attrs.get("otelprof.op.sequence_number")
        assert None in seq or seq[0] == seq[1] or stands_in(s) or stands_in(target)


# --- (g) request size -------------------------------------------------------------------------


def test_requests_within_limit(full: Decoded) -> None:
    sizes = [len(r) for r in full.result.requests]
    assert sizes and all(size <= DEFAULT_MAX_REQUEST_BYTES for size in sizes)
    assert full.result.stats["requests"] == len(sizes)
    assert sum(len(rs.scope_spans[0].spans) for m in full.messages for rs in m.resource_spans) == len(full.spans)
    if sum(sizes) > DEFAULT_MAX_REQUEST_BYTES:
        assert len(sizes) > 1


def test_small_request_limit_splits(engine: str) -> None:
    path = shared_trace("h100__gaunernst")
    limit = 64 * 1024
    whole = decode(convert_cached(path, engine, detail="full"))
    result = convert(path, engine=engine, detail="full", max_request_bytes=limit)
    assert len(result.requests) > 1
    assert result.stats["requests"] == len(result.requests)
    assert all(len(r) <= limit for r in result.requests)
    split = decode(result)  # asserts the same resource and scope in every request
    assert split.resource == whole.resource and split.resource["service.name"] == "unknown_service"
    assert split.scope_name == "otelprof"
    for m in split.messages:
        rs = m.resource_spans[0]
        assert len(rs.resource.attributes) == len(whole.messages[0].resource_spans[0].resource.attributes)
        assert rs.scope_spans[0].scope.name == "otelprof"
        assert len(rs.scope_spans[0].spans) >= 1
    # the same spans, in the same order, just cut into more requests
    assert all_spans_pb(result.requests) == all_spans_pb(whole.result.requests)
    # the cut is greedy: no request could have taken the next request's first span
    for k in range(len(result.requests) - 1):
        n = split.messages[k + 1].resource_spans[0].scope_spans[0].spans[0].ByteSize()
        grown = len(result.requests[k]) + 1 + len(_varint(n)) + n  # + up to 3 bytes of longer lengths
        assert grown + 3 > limit


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


# --- (h) exact integer nanoseconds ----------------------------------------------------------


def test_exact_timestamps(raw: RawTrace, full: Decoded) -> None:
    base = raw.base_ns
    for ordinal, e in raw.complete():
        span = full.span_of_event(ordinal)
        assert span is not None
        start = base + micros_to_ns(e["ts"])
        assert span.start == start, f"{e.get('name')}: ts {e['ts']}"
        assert span.end == start + micros_to_ns(e["dur"]), f"{e.get('name')}: dur {e['dur']}"


def test_base_time_traces_are_covered() -> None:
    small = [p for p in KINETO_TRACES if p.stat().st_size < 100_000]
    with_base = [p for p in small if "baseTimeNanoseconds" in load_raw(p).doc]
    assert with_base, "at least one small shared trace has baseTimeNanoseconds"


# --- (i) steps ---------------------------------------------------------------------------------


def _steps(raw: RawTrace) -> dict[int, int]:
    """step number -> ordinal of its (first) CPU-side ProfilerStep#N event."""
    out: dict[int, int] = {}
    for ordinal, e in raw.complete():
        name = e.get("name", "")
        if e.get("cat") not in DEVICE_CATEGORIES and isinstance(name, str) and name.startswith("ProfilerStep#"):
            suffix = name[len("ProfilerStep#") :]
            if suffix.isdigit():
                out.setdefault(int(suffix), ordinal)
    return out


def _split(raw: RawTrace) -> bool:
    world = (raw.doc.get("distributedInfo") or {}).get("world_size")
    return isinstance(world, int) and world >= 4


def test_steps(raw: RawTrace, full: Decoded) -> None:
    steps = _steps(raw)
    assert full.result.stats["steps"] == len(steps)
    split = _split(raw)
    by_thread: dict[tuple[Any, Any], list[tuple[int, int, int]]] = defaultdict(list)
    for ordinal, e in raw.complete():
        if e.get("cat") not in DEVICE_CATEGORIES:
            start = micros_to_ns(e["ts"])
            by_thread[(_ident(e.get("pid")), _ident(e.get("tid")))].append(
                (start, start + micros_to_ns(e["dur"]), ordinal)
            )
    step_traces = set()
    inside = 0
    for number, ordinal in steps.items():
        span = full.span_of_event(ordinal)
        assert span is not None
        assert span.attrs["otelprof.step.number"] == number
        assert span.parent_id == b"", "a step span is a root"
        step_traces.add(span.trace_id)
        members_trace = span.trace_id
        if split:
            assert len(full.by_trace[span.trace_id]) == 1, "in split mode the step trace holds the step span only"
            rank_links = [lk for lk in span.links if lk.attrs.get("otelprof.link.kind") == "rank_detail"]
            assert len(rank_links) == 1
            detail = full.by_id[rank_links[0].span_id]
            assert detail.trace_id == rank_links[0].trace_id != span.trace_id
            assert detail.synthetic and detail.parent_id == b""
            assert detail.name == span.name and detail.attrs["otelprof.step.number"] == number
            assert (detail.start, detail.end) == (span.start, span.end)
            back = [lk for lk in detail.links if lk.attrs.get("otelprof.link.kind") == "step"]
            assert [(lk.trace_id, lk.span_id) for lk in back] == [(span.trace_id, span.span_id)]
            if "otelprof.distributed.rank" in full.resource:
                assert detail.attrs["otelprof.distributed.rank"] == full.resource["otelprof.distributed.rank"]
            members_trace = detail.trace_id
        else:
            assert not any(lk.attrs.get("otelprof.link.kind") == "rank_detail" for lk in span.links)
        # what nests inside the step on its thread belongs to the step's trace: every event of the
        # thread inside the step that starts before the first event straddling the step's end
        # (such an event closes the step on the nesting stack, as in torch's own tree)
        e = raw.events[ordinal]
        s0 = micros_to_ns(e["ts"])
        s1 = s0 + micros_to_ns(e["dur"])
        thread = by_thread[(_ident(e.get("pid")), _ident(e.get("tid")))]
        cut = min((start for start, end, _ in thread if s0 < start < s1 and end > s1), default=s1)
        for start, end, other in thread:
            if other != ordinal and s0 <= start < cut and end <= s1:
                member = full.span_of_event(other)
                assert member is not None and member.trace_id == members_trace, (
                    f"{member and member.name} in step {number}"
                )
                inside += 1
    assert len(step_traces) == len(steps), "one trace per step"
    if steps and len(full.spans) > 100:
        assert inside > 0
    # CPU spans that belong to no step go to one window trace whose root is the Trace event
    # (without steps, iterations take theirs: tests/converter/test_iterations.py)
    iteration_traces = {s.trace_id for s in full.spans if "otelprof.iteration.number" in s.attrs}
    assert not (steps and iteration_traces)
    others = {s.trace_id for s in full.spans} - step_traces - iteration_traces
    if split:
        others -= {
            lk.trace_id for s in full.spans for lk in s.links if lk.attrs.get("otelprof.link.kind") == "rank_detail"
        }
    assert len(others) <= 1
    for tid in others:
        (root,) = [s for s in full.by_trace[tid] if not s.parent_id]
        assert root.category == "Trace" or root.name == "otelprof.window"
        assert "otelprof.step.number" not in root.attrs


RANK_PAIRS = [
    ("trace_filter__sampled_rank-0", "trace_filter__sampled_rank-1"),
    ("dlrm_kineto__worker0", "dlrm_kineto__worker1"),
]


@pytest.mark.parametrize("pair", RANK_PAIRS, ids=["trace_filter", "dlrm"])
def test_ranks_share_step_trace(engine: str, pair: tuple[str, str]) -> None:
    paths = [shared_trace(fragment) for fragment in pair]
    runs = [decode(convert_cached(p, engine, detail="full", run_id="run-42")) for p in paths]
    numbers = [set(_steps(load_raw(p))) for p in paths]
    common = numbers[0] & numbers[1]
    assert common, "the pair records the same steps"
    assert [r.resource["otelprof.distributed.rank"] for r in runs] == [0, 1]
    assert all(r.resource["otelprof.run.id"] == "run-42" for r in runs)
    for number in common:
        steps = [
            next(s for s in r.spans if s.attrs.get("otelprof.step.number") == number and not s.synthetic) for r in runs
        ]
        assert steps[0].trace_id == steps[1].trace_id, "same run id + step -> same trace id on every rank"
        assert steps[0].span_id != steps[1].span_id
        details = []
        for r, step in zip(runs, steps, strict=True):
            (lk,) = [lk for lk in step.links if lk.attrs.get("otelprof.link.kind") == "rank_detail"]
            detail = r.by_id[lk.span_id]
            assert [(b.trace_id, b.span_id) for b in detail.links] == [(step.trace_id, step.span_id)]
            assert detail.links[0].attrs == {"otelprof.link.kind": "step"}
            details.append(detail.trace_id)
        assert details[0] != details[1], "per-rank detail traces"
        assert steps[0].trace_id not in details
    # without a shared run id the files are different runs
    auto = [decode(convert_cached(p, engine, detail="full")) for p in paths]
    number = min(common)
    ids_auto = [
        next(s for s in r.spans if s.attrs.get("otelprof.step.number") == number and not s.synthetic).trace_id
        for r in auto
    ]
    assert ids_auto[0] != ids_auto[1]


# --- (j) determinism ---------------------------------------------------------------------------


def test_deterministic(trace: Path, engine: str, full: Decoded) -> None:
    if engine == "reference" and trace.stat().st_size > _BIG_FILE_BYTES:
        pytest.skip("reference determinism is checked on the smaller traces (and across processes below)")
    again = convert(trace, engine=engine, detail="full")
    assert again.requests == full.result.requests
    assert again.ops == full.result.ops
    assert again.stats == full.result.stats


_HASH_SCRIPT = """
import hashlib, json, sys
sys.path[:] = json.loads(sys.argv[4])  # import otelprof exactly as the parent did
from otelprof.converter import convert
from otelprof.otlp.names import fold_kernel_name
from otelprof.otlp.schema import CATEGORY_KIND, Kind
r = convert(sys.argv[1], engine=sys.argv[2], detail=sys.argv[3])
assert r.engine == sys.argv[2]
h = hashlib.sha256()
for b in r.requests:
    h.update(len(b).to_bytes(8, "little") + b)
print(h.hexdigest())
"""


@pytest.mark.parametrize("fragment,detail", [("dlrm_kineto__worker0", "default"), ("amd_trace__mi250", "full")])
def test_deterministic_across_processes(engine: str, fragment: str, detail: str) -> None:
    """A fresh interpreter with another hash seed gives the same bytes (no set/dict-order leaks)."""
    path = shared_trace(fragment)
    here = convert_cached(path, engine, detail=detail)
    h = hashlib.sha256()
    for b in here.requests:
        h.update(len(b).to_bytes(8, "little") + b)
    paths = [str(Path(p).resolve()) if p else os.getcwd() for p in sys.path]
    out = subprocess.run(
        [sys.executable, "-c", _HASH_SCRIPT, str(path), engine, detail, json.dumps(paths)],
        env=dict(os.environ, PYTHONHASHSEED="12345"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == h.hexdigest()
