"""Default detail on a GPU (issue 15 item 1): ops kept for the device time they launched, kernels
under the op that launched them, links only between the ops they name, a span budget per trace."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from converter_helpers import convert_cached, decode, shared_trace

from otelprof.converter import convert


def _ev(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 2, **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = {k.replace("_", " "): v for k, v in args.items()}
    return ev


def _launch(name: str, ts: float, dur: float, corr: int, kernel_ts: float, kernel_dur: float) -> list[dict[str, Any]]:
    """A runtime call on the CPU thread and the kernel it launched on stream 7."""
    return [
        _ev("cudaLaunchKernel", ts, dur, cat="cuda_runtime", correlation=corr),
        _ev(name, kernel_ts, kernel_dur, cat="kernel", tid=7, correlation=corr, device=0, stream=7),
    ]


def _trace(*events: dict[str, Any]) -> bytes:
    return json.dumps({"traceEvents": list(events)}).encode()


def _spans(data: bytes, engine: str, **opts: Any) -> tuple[dict[str, Any], Any]:
    d = decode(convert(data, engine=engine, **opts))
    by_name: dict[str, Any] = {}
    for s in d.spans:
        by_name.setdefault(s.name, s)
    return by_name, d


def test_ops_kept_for_their_device_time_and_kernels_under_their_op(engine: str) -> None:
    data = _trace(
        _ev("ProfilerStep#6", 0, 1000, cat="user_annotation"),
        # 7 µs on the CPU, but its kernel ran 15 µs: kept for the device time
        _ev("aten::mul", 100, 7),
        *_launch("mul_fwd", 102, 3, 1, 200, 15),
        # 6 µs on the CPU, a 3 µs kernel, nothing kept around it: kept as the kernel's launching op
        _ev("aten::add", 120, 6),
        *_launch("add_fwd", 121, 3, 2, 220, 3),
        # a 30 µs op holding a short op with a short kernel: the kernel hangs under aten::linear
        _ev("aten::linear", 300, 30),
        _ev("aten::addmm", 305, 5),
        *_launch("gemm_fwd", 306, 3, 3, 400, 4),
        # a 2 µs op launching nothing stays hidden
        _ev("aten::view", 500, 2),
    )
    spans, _d = _spans(data, engine)
    assert set(spans) == {
        "ProfilerStep#6",
        "aten::mul",
        "mul_fwd",
        "aten::add",
        "add_fwd",
        "aten::linear",
        "gemm_fwd",
    }
    assert spans["mul_fwd"].parent_id == spans["aten::mul"].span_id
    assert spans["add_fwd"].parent_id == spans["aten::add"].span_id
    assert spans["gemm_fwd"].parent_id == spans["aten::linear"].span_id
    step = spans["ProfilerStep#6"]
    assert step.attrs["otelprof.hidden"] == "1 hidden (shorter than 10 µs): aten::view ×1"
    assert spans["aten::mul"].attrs["otelprof.hidden"] == "1 hidden (shorter than 10 µs): cudaLaunchKernel ×1"
    assert spans["aten::linear"].attrs["otelprof.hidden"] == (
        "2 hidden (shorter than 10 µs): aten::addmm ×1, cudaLaunchKernel ×1"
    )
    # at full detail every event is a span, the kernel under its runtime call
    full, _ = _spans(data, engine, detail="full")
    assert full["gemm_fwd"].parent_id == full["cudaLaunchKernel"].span_id or "aten::addmm" in full


def test_device_copy_of_the_step_is_not_a_span(engine: str) -> None:
    data = _trace(
        _ev("ProfilerStep#2", 0, 100, cat="user_annotation", External_id=5),
        _ev("ProfilerStep#2", 40, 300, cat="gpu_user_annotation", tid=7, External_id=5, device=0),
        _ev("aten::mm", 10, 50),
    )
    spans, d = _spans(data, engine)
    assert [s.name for s in d.spans].count("ProfilerStep#2") == 1
    assert d.result.stats["dropped_step_copies"] == 1
    assert spans["ProfilerStep#2"].attrs["otelprof.hidden"] == "1 hidden (device copy of the step): ProfilerStep#2 ×1"
    _full, df = _spans(data, engine, detail="full")
    assert [s.name for s in df.spans].count("ProfilerStep#2") == 2


def test_links_join_the_ops_they_name_or_are_dropped(engine: str) -> None:
    fwd_seq = {"Sequence number": 11, "Fwd thread id": 0}
    data = _trace(
        _ev("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        {**_ev("aten::mm", 10, 40), "args": fwd_seq},
        {**_ev("aten::view", 60, 2), "args": {"Sequence number": 12, "Fwd thread id": 0}},
        {**_ev("MmBackward0", 500, 60, tid=3), "args": {"Sequence number": 11, "Fwd thread id": 2}},
        {**_ev("ViewBackward0", 600, 3, tid=3), "args": {"Sequence number": 12, "Fwd thread id": 2}},
    )
    spans, d = _spans(data, engine)
    assert [(lk.span_id, lk.attrs["otelprof.link.kind"]) for lk in spans["MmBackward0"].links] == [
        (spans["aten::mm"].span_id, "fwdbwd")
    ]
    # ViewBackward0 and aten::view are under 10 µs: their link is dropped, not moved to the step
    assert not spans["ProfilerStep#1"].links
    assert d.result.stats["links"] == 1 and d.result.stats["links_dropped"] == 1
    _full, df = _spans(data, engine, detail="full")
    assert df.result.stats["links"] == 2 and df.result.stats["links_dropped"] == 0


def _busy_step(n_ops: int) -> bytes:
    """A step of n_ops 12 µs ops, each launching one 20 µs kernel; names repeat in pairs of
    three so that runs of identical leaves exist; op k's kernel runs k ns longer (all distinct)."""
    events = [_ev("ProfilerStep#4", 0, 20 * n_ops + 100, cat="user_annotation")]
    for k in range(n_ops):
        t = 10 + 20 * k
        events.append(_ev(f"aten::op{k // 3}", t, 12))
        events.extend(_launch(f"kernel{k // 3}", t + 1, 2, 100 + k, t + 5, 20 + k / 1000))
    return _trace(*events)


def test_span_budget_aggregates_repeated_siblings_then_drops_the_least(engine: str) -> None:
    data = _busy_step(900)  # 1 + 900 ops + 900 kernels = 1,801 spans at full detail
    full = decode(convert(data, engine=engine, detail="full", min_duration_ns=0))
    assert len(full.spans) == 1 + 3 * 900
    d = decode(convert(data, engine=engine, span_budget=1000))
    st = d.result.stats
    assert len(d.spans) == 1000 == st["spans"]
    # each kernel is a lone leaf under its op: no runs there; the ops are no leaves: no runs;
    # so the least significant go: the ops' worth is their kernel's (20 µs + k ns), kernels first
    assert st["dropped_budget"] > 0
    step = next(s for s in d.spans if s.name == "ProfilerStep#4")
    assert "over the 1000-span budget" in step.attrs["otelprof.hidden"]
    assert sum(s.attrs.get("otelprof.hidden_spans", 0) for s in d.spans) == st["dropped_budget"] + st["dropped_short"]
    for s in d.spans:  # every kernel still sits under the op that launched it
        if s.category == "kernel":
            assert d.by_id[s.parent_id].name == "aten::op" + s.name.removeprefix("kernel")
    # a smaller budget keeps the most significant: the latest ops (longest kernels) survive
    small = decode(convert(data, engine=engine, span_budget=10))
    kept = sorted(s.name for s in small.spans if s.category == "cpu_op")
    assert len(small.spans) == 10 and kept[-1] == "aten::op299"
    # no budget: everything stays
    assert len(decode(convert(data, engine=engine, span_budget=0)).spans) == 1 + 2 * 900


def test_span_budget_aggregates_repeated_leaves_first(engine: str) -> None:
    events = [_ev("ProfilerStep#1", 0, 100_000, cat="user_annotation")]
    for k in range(1500):  # 1,500 identical 20 µs leaves under the step, another op between each
        events.append(_ev("aten::copy_", 10 + 60 * k, 20))
        events.append(_ev("aten::mul", 40 + 60 * k, 15 + k % 2))
    d = decode(convert(_trace(*events), engine=engine, span_budget=100))
    aggs = {s.name: s for s in d.spans if "otelprof.aggregated_count" in s.attrs}
    # repeated, not consecutive: one aggregate per name, first start to last end
    assert set(aggs) == {"aten::copy_ \N{MULTIPLICATION SIGN}1500", "aten::mul \N{MULTIPLICATION SIGN}1500"}
    copy, mul = aggs["aten::copy_ \N{MULTIPLICATION SIGN}1500"], aggs["aten::mul \N{MULTIPLICATION SIGN}1500"]
    assert (copy.start, copy.end) == (10_000, (10 + 60 * 1499 + 20) * 1000)
    assert copy.attrs["otelprof.aggregated_duration_ns"] == 1500 * 20_000
    assert (mul.attrs["otelprof.aggregated_min_ns"], mul.attrs["otelprof.aggregated_max_ns"]) == (15_000, 16_000)
    assert mul.attrs["otelprof.aggregated_duration_ns"] == 750 * 15_000 + 750 * 16_000
    assert d.result.stats["dropped_budget"] == 0 and len(d.spans) == 3


def test_real_gpu_traces_at_default_detail(engine: str) -> None:
    """The ns_resolution trace (ResNet on a V100): before, 746 kernels hung off the step roots
    and steps held up to 3,409 spans; now every launched kernel hangs under an op."""
    path = shared_trace("ns_resolution_trace")
    d = decode(convert_cached(path, "native", detail="default"))
    roots = {s.span_id for s in d.spans if not s.parent_id}
    off_root = [s for s in d.spans if s.category == "kernel" and s.parent_id in roots]
    assert off_root == []
    per_trace = Counter(s.trace_id for s in d.spans)
    assert max(per_trace.values()) <= 1000
    assert d.result.stats["dropped_budget"] > 0
    for s in d.spans:
        for lk in s.links:
            if lk.attrs.get("otelprof.link.kind") == "fwdbwd":
                assert lk.span_id in d.by_id and "otelprof.step.number" not in d.by_id[lk.span_id].attrs
