"""Readable traces that account for every event (docs/semantic-conventions.md, "Volume"): at
default detail every complete event of a trace is a span, a member of an aggregate span, or
folded into the span above it, and the time of each class of events adds up to the nanosecond;
device work with no op above it goes under a GPU lane, never under a root; no span name is over
128 characters; every trace root says what its trace folded."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import (
    ENGINES,
    KINETO_TRACES,
    LAUNCHED_CATEGORIES,
    Decoded,
    convert_cached,
    decode,
    load_raw,
    micros_to_ns,
    reference_skips_default,
    shared_trace,
)

from otelprof.converter import convert
from otelprof.otlp import ids
from otelprof.otlp.schema import CATEGORY_KIND, Kind

#: The classes the accounting is kept in (``otelprof.folded.<class>.*``), by kind.
CLASS = {
    Kind.OTHER: "op", Kind.CPU_OP: "op", Kind.ANNOTATION: "op", Kind.TRACE: "trace", Kind.PYTHON: "python",
    Kind.RUNTIME: "runtime", Kind.KERNEL: "kernel", Kind.MEMCPY: "memcpy", Kind.MEMSET: "memset",
    Kind.SYNC: "device_other", Kind.GPU_ANNOTATION: "device_other",
}  # fmt: skip
MULT = "\N{MULTIPLICATION SIGN}"


def _class(category: str) -> str:
    return CLASS[CATEGORY_KIND.get(category, Kind.OTHER)]


def raw_totals(events: list[dict[str, Any]]) -> tuple[Counter[str], Counter[str]]:
    """Count and summed duration of the complete events by class, from the JSON itself."""
    count: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X":
            c = _class(e.get("cat") or "")
            count[c] += 1
            total[c] += micros_to_ns(e["dur"])
    return count, total


def sent_totals(d: Decoded) -> tuple[Counter[str], Counter[str]]:
    """The same, from what was sent: event spans, aggregates and what parents say they folded."""
    count: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for s in d.spans:
        for key, value in s.attrs.items():
            if key.startswith("otelprof.folded."):
                c, what = key.split(".")[2:4]
                (count if what == "count" else total)[c] += value
        if s.synthetic:
            continue
        c = _class(s.category)
        if "otelprof.aggregated_count" in s.attrs:
            count[c] += s.attrs["otelprof.aggregated_count"]
            total[c] += s.attrs["otelprof.aggregated_duration_ns"]
        else:
            count[c] += 1
            total[c] += s.end - s.start
    return count, total


def check_accounting(d: Decoded, events: list[dict[str, Any]]) -> None:
    raw_count, raw_total = raw_totals(events)
    count, total = sent_totals(d)
    # the profiler's own envelope (a Trace event) alone in its window trace is no work: not sent
    dropped_roots = d.result.stats["dropped_window_roots"]
    assert raw_count.pop("trace", 0) == count.pop("trace", 0) + dropped_roots
    raw_total.pop("trace", None)
    total.pop("trace", None)
    assert count == raw_count
    assert total == raw_total


def check_readable(d: Decoded, budget: int = 1000) -> None:
    roots = {s.span_id for s in d.spans if not s.parent_id or "otelprof.step.number" in s.attrs}
    for s in d.spans:
        assert len(s.name) <= 128, s.name
        if s.category in LAUNCHED_CATEGORIES:
            assert s.parent_id not in roots, f"{s.name} hangs off a root"
    per_trace = Counter(s.trace_id for s in d.spans)
    assert max(per_trace.values(), default=0) <= budget
    # every trace root says what its trace folded: hidden events and aggregate members
    for trace_id, members in d.by_trace.items():
        hidden = sum(s.attrs.get("otelprof.hidden_spans", 0) for s in members)
        aggregated = sum(s.attrs.get("otelprof.aggregated_count", 0) for s in members)
        top = [s for s in members if s.attrs.get("otelprof.trace.hidden_events") is not None]
        top += [s for s in members if s.attrs.get("otelprof.trace.aggregated_events") is not None]
        said_hidden = sum({id(s): s.attrs.get("otelprof.trace.hidden_events", 0) for s in top}.values())
        said_aggregated = sum({id(s): s.attrs.get("otelprof.trace.aggregated_events", 0) for s in top}.values())
        assert (said_hidden, said_aggregated) == (hidden, aggregated), trace_id.hex()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "path"),
    [
        pytest.param(engine, path, id=f"{engine}-{path.name.split('__')[-1][:40]}")
        for path in KINETO_TRACES
        for engine in ENGINES
        if not (engine == "reference" and reference_skips_default(path))  # converted in another test
    ],
    indirect=["engine"],
)
def test_shared_traces_account_for_every_event(engine: str, path: Path) -> None:
    d = decode(convert_cached(path, engine))
    check_accounting(d, load_raw(path).events)
    check_readable(d)


def test_a_recorded_step_with_python_functions_accounts_for_every_event(
    engine: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pytest.importorskip("torch")
    from torch_recordings import recorded

    rec = recorded(tmp_path_factory, "transformer_adamw", with_stack=True)
    events = json.loads(rec.path.read_text())["traceEvents"]
    assert any(e.get("cat") == "python_function" for e in events)
    for budget in (1000, 60):  # under a small budget the trimmed spans fold, with their time
        d = decode(convert(rec.path, engine=engine, span_budget=budget))
        check_accounting(d, events)
        check_readable(d, budget)
        if budget == 60:
            assert d.result.stats["dropped_budget"] > 0 and d.result.stats["aggregate_spans"] > 0


# --- GPU lanes --------------------------------------------------------------------------------


def _x(name: str, cat: str, ts: float, dur: float, pid: int = 1, tid: int = 2, **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def _lanes_trace() -> bytes:
    events = [
        _x("ProfilerStep#3", "user_annotation", 0, 1000),
        _x("aten::mm", "cpu_op", 10, 50),
        _x("cudaLaunchKernel", "cuda_runtime", 20, 5, correlation=1),
        _x("mm_fwd", "kernel", 100, 40, pid=0, tid=7, correlation=1, device=0, stream=7),
        # launched by nothing in the trace: two streams of device 0, one of device 1
        _x("nccl_kernel", "kernel", 200, 300, pid=0, tid=20, correlation=99, device=0, stream=20),
        _x("nccl_kernel", "kernel", 600, 100, pid=0, tid=20, device=0, stream=20),
        _x("Memcpy HtoD", "gpu_memcpy", 150, 30, pid=0, tid=7, correlation=98, device=0, stream=7),
        _x("other_kernel", "kernel", 300, 10, pid=1, tid=7, device=1, stream=7),
        # a short launch with no op above it: folded into the step, its kernel to the lane
        _x("cudaLaunchKernel", "cuda_runtime", 700, 2, correlation=5),
        _x("lone_kernel", "kernel", 710, 20, pid=0, tid=7, correlation=5, device=0, stream=7),
    ]
    return json.dumps({"traceEvents": events}).encode()


def test_device_work_without_a_launch_goes_under_a_lane(engine: str) -> None:
    d = decode(convert(_lanes_trace(), engine=engine, run_id="lanes"))
    by = {s.event_name: s for s in d.spans if "otelprof.aggregated_count" not in s.attrs}
    step = by["ProfilerStep#3"]
    lanes = {s.name: s for s in d.spans if s.name.startswith("gpu ")}
    assert set(lanes) == {
        "gpu 0 \N{MIDDLE DOT} stream 20",
        "gpu 0 \N{MIDDLE DOT} stream 7",
        "gpu 1 \N{MIDDLE DOT} stream 7",
    }
    for lane in lanes.values():
        assert lane.parent_id == step.span_id and lane.trace_id == step.trace_id and lane.synthetic
        assert lane.attrs["otelprof.event.category"] == "otelprof"
    s20 = lanes["gpu 0 \N{MIDDLE DOT} stream 20"]
    assert (s20.attrs["otelprof.gpu.device"], s20.attrs["otelprof.gpu.stream"]) == (0, 20)
    # two launchless kernels of one name under one lane: aggregated only over the budget
    assert [s.parent_id for s in d.spans if s.event_name == "nccl_kernel"] == [s20.span_id] * 2
    assert (s20.start, s20.end) == (200_000, 700_000)  # covering the activity under it
    s7 = lanes["gpu 0 \N{MIDDLE DOT} stream 7"]
    assert by["Memcpy HtoD"].parent_id == s7.span_id and (s7.start, s7.end) == (150_000, 730_000)
    assert d.by_id[by["mm_fwd"].parent_id].name == "aten::mm"  # launched: under the op that did
    assert by["lone_kernel"].parent_id == s7.span_id and "cudaLaunchKernel" in step.attrs["otelprof.hidden"]
    # lane ids: E + S + 1 + I + j (E events, S steps, I iterations; j in order of first event)
    base = ids.span_base("lanes", "", d.result.window_id)
    order = ["gpu 0 \N{MIDDLE DOT} stream 7", "gpu 0 \N{MIDDLE DOT} stream 20", "gpu 1 \N{MIDDLE DOT} stream 7"]
    assert [lanes[name].span_id for name in order] == [ids.span_id(base, 10 + 1 + 1 + j) for j in range(3)]


def test_budget_trimmed_launches_leave_their_kernels_to_lanes(engine: str) -> None:
    """A step of 300 ops, each launching a kernel, under a budget of 50: the ops the budget drops
    leave their kernels to the lane (kernels of one name then aggregated), never to the step."""
    events = [_x("ProfilerStep#1", "user_annotation", 0, 100_000)]
    for k in range(300):
        events.append(_x(f"aten::op{k}", "cpu_op", 10 + 300 * k, 20))
        events.append(_x("cudaLaunchKernel", "cuda_runtime", 12 + 300 * k, 5, correlation=k + 1))
        events.append(_x(f"kern{k % 3}", "kernel", 50 + 300 * k, 15 + k, pid=0, tid=7, correlation=k + 1))
    data = json.dumps({"traceEvents": events}).encode()
    d = decode(convert(data, engine=engine, span_budget=50))
    check_readable(d, 50)
    check_accounting(d, events)
    (lane,) = (s for s in d.spans if s.name.startswith("gpu "))
    under = [s for s in d.spans if s.parent_id == lane.span_id]
    assert all(s.category == "kernel" for s in under)
    assert lane.attrs.get("otelprof.folded.kernel.count", 0) + sum(
        s.attrs.get("otelprof.aggregated_count", 1) for s in under
    ) == 300 - sum(1 for s in d.spans if s.category == "kernel" and d.by_id[s.parent_id].category != "otelprof")


# --- aggregates, links, roots ------------------------------------------------------------------


def test_aggregate_spans_say_count_total_self_min_max(engine: str) -> None:
    events = [_x("ProfilerStep#1", "user_annotation", 0, 10_000), _x("aten::linear", "cpu_op", 10, 5000)]
    for k in range(40):  # short siblings with a child each: self excludes the child
        events.append(_x("aten::t", "cpu_op", 20 + 100 * k, 2 + k % 3))
        events.append(_x("aten::transpose", "cpu_op", 20.5 + 100 * k, 1))
    d = decode(convert(json.dumps({"traceEvents": events}).encode(), engine=engine))
    (agg,) = (s for s in d.spans if "otelprof.aggregated_count" in s.attrs)
    durs = [(2 + k % 3) * 1000 for k in range(40)]
    assert agg.name == f"aten::t {MULT}40"
    assert agg.attrs["otelprof.aggregated_count"] == 40
    assert agg.attrs["otelprof.aggregated_duration_ns"] == sum(durs)
    assert agg.attrs["otelprof.aggregated_self_ns"] == sum(durs) - 40 * 1000
    assert (agg.attrs["otelprof.aggregated_min_ns"], agg.attrs["otelprof.aggregated_max_ns"]) == (2000, 4000)
    linear = next(s for s in d.spans if s.name == "aten::linear")
    assert agg.parent_id == linear.span_id
    # the children of aggregated ops fold into the op above the aggregate
    assert linear.attrs["otelprof.folded.op.count"] == 40
    assert linear.attrs["otelprof.folded.op.duration_ns"] == 40_000


def test_links_from_hidden_backward_ops_follow_what_holds_them(engine: str) -> None:
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 10_000),
        _x("aten::mul", "cpu_op", 10, 30, **{"Sequence number": 7, "Fwd thread id": 0}),
        _x("aten::add", "cpu_op", 50, 30, **{"Sequence number": 8, "Fwd thread id": 0}),
        # backward: MulBackward0 short, under a kept evaluate_function; AddBackward0 twice short
        # siblings of one name (aggregated)
        _x("autograd::engine::evaluate_function: MulBackward0", "cpu_op", 100, 40),
        _x("MulBackward0", "cpu_op", 101, 3, **{"Sequence number": 7, "Fwd thread id": 1}),
        _x("autograd::engine::evaluate_function: AddBackward0", "cpu_op", 200, 40),
        _x("AddBackward0", "cpu_op", 201, 3, **{"Sequence number": 8, "Fwd thread id": 1}),
        _x("AddBackward0", "cpu_op", 205, 3, **{"Sequence number": 9, "Fwd thread id": 1}),
    ]
    d = decode(convert(json.dumps({"traceEvents": events}).encode(), engine=engine))
    names = {s.name: s for s in d.spans}
    links = {s.name: [lk.span_id for lk in s.links] for s in d.spans if s.links}
    assert links["autograd::engine::evaluate_function: MulBackward0"] == [names["aten::mul"].span_id]
    assert links[f"AddBackward0 {MULT}2"] == [names["aten::add"].span_id]
    assert not names["ProfilerStep#1"].links


def test_source_file_named_on_every_root(engine: str) -> None:
    path = shared_trace("trace_filter__sampled_rank-0")  # split detail traces: step, detail, window roots
    d = decode(convert(path, engine=engine, source_file="/data/kept/rank0.pt.trace.json.gz"))
    named = [s for s in d.spans if "otelprof.source.file" in s.attrs]
    roots = [s for s in d.spans if not s.parent_id]
    assert {s.span_id for s in named} == {s.span_id for s in roots}
    assert {s.attrs["otelprof.source.file"] for s in named} == {"/data/kept/rank0.pt.trace.json.gz"}
    assert not any("otelprof.source.file" in s.attrs for s in decode(convert(path, engine=engine)).spans)


def test_long_names_are_cut_whole_name_kept(engine: str) -> None:
    long = "autograd::engine::evaluate_function: " + "torch::autograd::CppNode<" * 8 + "X" + ">" * 8
    events = [_x("ProfilerStep#1", "user_annotation", 0, 1000), _x(long, "cpu_op", 10, 50)]
    events += [_x(long, "cpu_op", 100 + 5 * k, 2) for k in range(3)]  # aggregated: named with the count
    d = decode(convert(json.dumps({"traceEvents": events}).encode(), engine=engine))
    cut = [s for s in d.spans if s.attrs.get("otelprof.event.name") == long]
    assert len(cut) == 2 and all(len(s.name) == 128 for s in cut)
    assert cut[0].name == long[:127] + "\N{HORIZONTAL ELLIPSIS}"
    assert cut[1].name.endswith(f"\N{HORIZONTAL ELLIPSIS} {MULT}3")


def test_real_trace_roots_report_their_folds() -> None:
    """The Qwen-like symptom: a step root with hundreds of direct children. On the DLRM rank
    whose launches are missing, kernels go to one lane per stream instead."""
    d = decode(convert_cached(shared_trace("dlrm_kineto__worker1"), "native"))
    lanes = [s for s in d.spans if s.name.startswith("gpu ")]
    assert lanes and all(d.by_id[s.parent_id].name.startswith("ProfilerStep#") for s in lanes)
    under = Counter(s.parent_id for s in d.spans)
    assert all(under[lane.span_id] > 0 or "otelprof.hidden_spans" in lane.attrs for lane in lanes)
    check_readable(d)


def test_a_lane_of_a_trace_whose_stream_ids_are_text(engine: str) -> None:
    """2021 traces name a device event's tid "stream 7": the lane says it once."""
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 1000),
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 10, "dur": 5},
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 9", "ts": 20, "dur": 5},
    ]
    d = decode(convert(json.dumps({"traceEvents": events}).encode(), engine=engine))
    lanes = sorted(s.name for s in d.spans if s.name.startswith("gpu "))
    assert lanes == ["gpu 0 \N{MIDDLE DOT} stream 7", "gpu 0 \N{MIDDLE DOT} stream 9"]
    assert not any("otelprof.gpu.stream" in s.attrs for s in d.spans if s.name.startswith("gpu "))
