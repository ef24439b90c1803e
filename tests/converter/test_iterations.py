"""Windows without ProfilerStep events are cut into iteration traces (docs/semantic-conventions.md,
"Traces"): by outermost ``Optimizer.step#<Name>.step`` annotations, else at default detail into
``span_budget`` chunks of top-level CPU subtrees. Each iteration trace is rooted at a synthetic
``Iteration#k`` span linked to the window root."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from converter_helpers import (
    Decoded,
    convert_cached,
    decode,
    load_raw,
    native_required,
    shared_trace,
    skip_unless_native,
)

from otelprof.converter import convert, native_available
from otelprof.otlp import ids
from otelprof.otlp.spans import millis

CPU_CATEGORIES = {"cpu_op", "Operator", "user_annotation"}
RUNTIME_CATEGORIES = {"cuda_runtime", "Runtime"}
KERNEL_CATEGORIES = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}


def _is_optimizer_step(name: str) -> bool:
    return name.startswith("Optimizer.step#") and name.endswith(".step") and len(name) > 20


def _trace(*events: dict[str, Any]) -> bytes:
    return json.dumps({"traceEvents": list(events)}).encode()


def _x(name: str, cat: str, ts: float, dur: float, tid: Any = 1, pid: Any = 1, **args: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        event["args"] = args
    return event


def _training(iterations: int = 3, profiler_trace: bool = True, tail: bool = True) -> bytes:
    """A cut-down training loop: per iteration a conv (launching a kernel), short ops, zero_grad
    and the optimizer step (with an inner optimizer annotation in the first), all under one
    python_function that crosses every iteration; a DataLoader op on a second thread crossing
    the first boundary; optionally an op after the last optimizer step and the Trace event."""
    events: list[dict[str, Any]] = []
    t0, period = 1_000_000.0, 1000.0
    end = t0 + iterations * period + 300
    events.append(_x("train.py(10): <module>", "python_function", t0, end - t0))
    for k in range(iterations):
        t = t0 + k * period
        corr = 100 + k
        events.append(_x("aten::conv2d", "cpu_op", t + 10, 200))
        events.append(_x("cudaLaunchKernel", "cuda_runtime", t + 20, 20, correlation=corr))
        events.append(_x("conv_fwd", "kernel", t + 900, 250, tid=7, pid=0, correlation=corr))
        for j in range(3):
            events.append(_x("aten::empty", "cpu_op", t + 300 + 3 * j, 2))
        events.append(_x("Optimizer.zero_grad#SGD.zero_grad", "user_annotation", t + 400, 40))
        events.append(_x("Optimizer.step#SGD.step", "user_annotation", t + 600, 200, **{"External id": 500 + k}))
        events.append(_x("aten::add_", "cpu_op", t + 610, 50))
        if k == 0:
            events.append(_x("Optimizer.step#Inner.step", "user_annotation", t + 700, 50))
        events.append(
            _x("Optimizer.step#SGD.step", "gpu_user_annotation", t + 950, 30, tid=7, pid=0, **{"External id": 500 + k})
        )
    events.append(_x("DataLoader.__next__", "cpu_op", t0 + 500, 700, tid=2))
    if tail:
        events.append(_x("aten::mean", "cpu_op", t0 + iterations * period + 100, 100))
    if profiler_trace:
        events.append(_x("PyTorch Profiler (0)", "Trace", t0 - 5, end - t0 + 500, tid="PyTorch Profiler", pid="Spans"))
    return _trace(*events)


def _both(data: bytes, **fields: Any) -> Decoded:
    """Converts with both engines, asserts the same bytes and stats, returns the decoded result."""
    reference = convert(data, engine="reference", **fields)
    if native_available() or native_required():
        native = convert(data, engine="native", **fields)
        assert native.requests == reference.requests
        assert native.stats == reference.stats
    return decode(reference)


def _iteration_roots(d: Decoded) -> list[Any]:
    return [s for s in d.spans if "otelprof.iteration.number" in s.attrs or "otelprof.window.part" in s.attrs]


def _window_root(d: Decoded, iteration_root: Any) -> Any:
    (link,) = iteration_root.links
    assert link.attrs == {"otelprof.link.kind": "window"}
    root = d.by_id[link.span_id]
    assert root.trace_id == link.trace_id and root.parent_id == b""
    return root


def _check_structure(d: Decoded, source: str) -> list[Any]:
    """Roots, ids, links and order of iteration traces; returns the roots in order."""
    roots = _iteration_roots(d)
    assert roots, "no iteration traces"
    st = d.result.stats
    assert st["iterations"] == len(roots) and st["steps"] == 0
    run_id = str(d.resource["otelprof.run.id"])
    rank = d.resource.get("otelprof.distributed.rank")
    rank_s = "" if rank is None else str(rank)
    base = ids.span_base(run_id, rank_s, d.result.window_id)
    window_root = _window_root(d, roots[0])
    order = [s.trace_id for s in d.spans if not s.parent_id]
    assert order == [r.trace_id for r in roots] + [window_root.trace_id], "iterations in order, then the window"
    t0 = min(s.start for s in d.spans)
    for k, root in enumerate(roots, 1):
        assert root.parent_id == b""
        assert root.attrs["otelprof.event.category"] == "otelprof"
        if source == "span_budget":  # a part of the window: its order and the time it covers
            offsets = f"{millis(root.start - t0)}\N{EN DASH}{millis(root.end - t0)} ms"
            assert root.name == f"window part {k}/{len(roots)} ({offsets})"
            assert (root.attrs["otelprof.window.part"], root.attrs["otelprof.window.parts"]) == (k, len(roots))
            assert "otelprof.iteration.number" not in root.attrs
        else:
            assert root.name == f"Iteration#{k}"
            assert root.attrs["otelprof.iteration.number"] == k
            assert root.attrs["otelprof.iteration.source"] == source
        assert list(root.attrs)[-1] == "otelprof.synthetic" and root.synthetic
        assert root.trace_id == ids.trace_id(f"iteration|{run_id}|{rank_s}|{d.result.window_id}|{k}")
        assert root.span_id == ids.span_id(base, st["events_total"] + k)  # after the window root's ordinal
        assert _window_root(d, root) is window_root
        members = d.by_trace[root.trace_id]
        assert [s for s in members if not s.parent_id] == [root]
        assert members[0] is root, "each trace's root first"
        for s in members:  # parent chains stay in the trace and end at the root
            seen = 0
            while s.parent_id:
                s = d.by_id[s.parent_id]
                assert s.trace_id == root.trace_id
                seen += 1
                assert seen < 1000
            assert s is root
        assert root.start <= min(s.start for s in members) and root.end >= max(s.end for s in members)
    assert st["synthetic_spans"] == sum(1 for s in d.spans if s.synthetic)
    return roots


# --- optimizer-marked iterations on a synthetic trace (both engines) ---------------------------


@pytest.mark.parametrize("detail", ["default", "full"])
@pytest.mark.parametrize("variant", ["trace_event", "no_trace_event", "no_tail_no_trace_event"])
def test_optimizer_iterations(detail: str, variant: str) -> None:
    data = _training(profiler_trace=variant == "trace_event", tail=variant != "no_tail_no_trace_event")
    d = _both(data, detail=detail)
    roots = _check_structure(d, "optimizer_step")
    assert len(roots) == 3, "the inner Optimizer.step#Inner.step and the device copies make no iteration"
    by_name: dict[str, list[Any]] = {}
    for s in d.spans:
        by_name.setdefault(s.name, []).append(s)
    for k, root in enumerate(roots):
        children = {s.name for s in d.by_trace[root.trace_id] if s.parent_id == root.span_id}
        expected = {"aten::conv2d", "Optimizer.zero_grad#SGD.zero_grad", "Optimizer.step#SGD.step"}
        if detail == "full":
            expected.add("aten::empty")
        else:  # short, and their parent (the python_function) is dropped: counted on the root
            assert root.attrs["otelprof.hidden_spans"] == 3
        assert children == expected
        assert by_name["conv_fwd"][k].trace_id == root.trace_id, "a kernel follows its launch"
        cpu_step = [s for s in by_name["Optimizer.step#SGD.step"] if s.category == "user_annotation"][k]
        assert cpu_step.trace_id == root.trace_id
        gpu_step = [s for s in by_name["Optimizer.step#SGD.step"] if s.category == "gpu_user_annotation"][k]
        assert gpu_step.trace_id == root.trace_id and gpu_step.parent_id == cpu_step.span_id
    window = _window_root(d, roots[0])
    window_members = {s.name for s in d.by_trace[window.trace_id]}
    assert "DataLoader.__next__" in window_members, "an event crossing a boundary stays in the window"
    if variant != "no_tail_no_trace_event":
        assert "aten::mean" in window_members, "events after the last optimizer step stay in the window"
    if detail == "full":
        assert "train.py(10): <module>" in window_members
    if variant == "trace_event":
        assert window.name == "PyTorch Profiler (0)"
    else:
        assert window.name == "otelprof.window" and window.synthetic
        assert window.span_id == d.span_id_of_event(d.result.stats["events_total"])
    if variant == "no_tail_no_trace_event":
        assert window_members == {"otelprof.window", "DataLoader.__next__"} | (
            {"train.py(10): <module>"} if detail == "full" else set()
        )


def test_no_markers_no_budget_one_window() -> None:
    data = _trace(*[_x(f"op{k}", "cpu_op", 1000.0 + 100 * k, 50) for k in range(20)])
    d = _both(data, detail="default")
    assert d.result.stats["iterations"] == 0
    assert len({s.trace_id for s in d.spans}) == 1 and not any(s.synthetic for s in d.spans[1:])


def test_steps_win_over_optimizer_marks() -> None:
    events = json.loads(_training())["traceEvents"]
    events.append(_x("ProfilerStep#1", "user_annotation", 999_000.0, 5000, tid=3))
    d = _both(_trace(*events), detail="default")
    assert d.result.stats["steps"] == 1 and d.result.stats["iterations"] == 0
    assert not _iteration_roots(d)


# --- span_budget chunks (both engines) ------------------------------------------------------


def _markerless(sizes: list[int]) -> bytes:
    """Top-level ops on two threads; op k holds sizes[k] kept spans (itself, children and, for
    every other op, a launch and its kernel), and a short python_function dropped at default."""
    events: list[dict[str, Any]] = []
    t = 1000.0
    corr = 0
    for k, size in enumerate(sizes):
        tid = 1 + k % 2
        events.append(_x(f"top{k}", "cpu_op", t, 100 * size + 50, tid=tid))
        rest = size - 1
        if rest >= 2 and k % 2:
            corr += 1
            events.append(_x("cudaLaunchKernel", "cuda_runtime", t + 1, 20, tid=tid, correlation=corr))
            events.append(_x("kern", "kernel", t + 5000, 30, tid=9, pid=0, correlation=corr))
            rest -= 2
        for j in range(rest):
            events.append(_x("child", "cpu_op", t + 30 + 100 * j, 20, tid=tid))
        events.append(_x("f", "python_function", t + 100 * size + 60, 1, tid=tid))
        t += 100 * size + 80
    return _trace(*events)


def _chunks(sizes: list[int], budget: int) -> list[list[int]]:
    out: list[list[int]] = []
    held = 0
    for k, size in enumerate(sizes):
        if not out or (held and held + size > budget):
            out.append([])
            held = 0
        out[-1].append(k)
        held += size
    return out


@pytest.mark.parametrize("budget", [10, 25])
def test_span_budget_chunks(budget: int) -> None:
    sizes = [3, 4, 1, 5, 30, 2, 2, 9, 1, 1, 6, 3, 12, 4, 4]
    d = _both(_markerless(sizes), detail="default", span_budget=budget)
    roots = _check_structure(d, "span_budget")
    # top-level events in time order: op k, then its python_function (no kept span: dropped)
    sequence = [size for size in sizes for size in (size, 0)]
    expected = _chunks(sequence, budget)
    assert len(roots) == len(expected) > 1
    for root, chunk in zip(roots, expected, strict=True):
        members = d.by_trace[root.trace_id]
        tops = sorted(int(s.name[3:]) for s in members if s.parent_id == root.span_id)
        assert tops == [k // 2 for k in chunk if k % 2 == 0]
        kept = len(members) - 1
        if sum(sequence[k] for k in chunk) + 1 > budget:  # with its root over the budget: trimmed to it
            assert len(members) <= budget
            continue
        assert kept == sum(sequence[k] for k in chunk)
        assert root.attrs.get("otelprof.hidden_spans", 0) == sum(k % 2 for k in chunk)
        for s in members:
            if s.name == "kern":
                assert d.by_id[s.parent_id].name == "cudaLaunchKernel"
    window = _window_root(d, roots[0])
    assert [s.name for s in d.by_trace[window.trace_id]] == ["otelprof.window"]


def test_span_budget_not_at_full_detail_nor_zero_nor_under() -> None:
    sizes = [5] * 10
    data = _markerless(sizes)
    for fields in ({"detail": "full", "span_budget": 10}, {"span_budget": 0}, {"span_budget": 50}):
        d = _both(data, **fields)
        assert d.result.stats["iterations"] == 0, fields
        assert len({s.trace_id for s in d.spans}) == 1
    assert _both(data, span_budget=49).result.stats["iterations"] == 2  # 45 + 5 kept spans


def test_span_budget_on_a_real_trace() -> None:
    """AlexNet (2023) has neither steps nor optimizer marks: one window at the default budget,
    chunks under a small one."""
    path = shared_trace("critical_path__alexnet")
    default = decode(convert_cached(path, "reference"))
    assert default.result.stats["iterations"] == 0 and default.result.stats["spans"] < 1000
    small = _both(path.read_bytes(), span_budget=100)
    assert small.result.stats["iterations"] >= 1
    _check_structure(small, "span_budget")


# --- real traces without steps: native on the big ones --------------------------------------------


def _raw_optimizer_steps(fragment: str) -> int:
    """Outermost CPU-side Optimizer.step#<Name>.step events of a shared trace, from the raw JSON."""
    raw = load_raw(shared_trace(fragment))
    marks = [
        e
        for _, e in raw.complete()
        if e.get("cat") in CPU_CATEGORIES and isinstance(e.get("name"), str) and _is_optimizer_step(e["name"])
    ]
    by_thread: dict[Any, list[tuple[Any, Any]]] = {}
    for e in marks:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append((e["ts"], e["ts"] + e["dur"]))
    outer = 0
    for spans in by_thread.values():
        spans.sort()
        end = None
        for start, stop in spans:
            if end is None or start >= end:
                outer += 1
                end = stop
    return outer


def _native(fragment: str, detail: str) -> Decoded:
    skip_unless_native()
    return decode(convert_cached(shared_trace(fragment), "native", detail=detail))


@pytest.mark.parametrize("detail", ["default", "full"])
@pytest.mark.parametrize(
    "fragment", [pytest.param("resnet50_autograd_api", marks=pytest.mark.slow), "mi300__ddp_resnet18"]
)
def test_real_traces_without_steps(fragment: str, detail: str) -> None:
    expected = _raw_optimizer_steps(fragment)
    assert expected >= 5
    d = _native(fragment, detail)
    roots = _check_structure(d, "optimizer_step")
    assert len(roots) == expected
    raw = load_raw(shared_trace(fragment))
    # every kernel (memcpy, memset) is in the same trace as its launching runtime call
    launch: dict[Any, bytes] = {}
    device: list[tuple[Any, bytes]] = []
    for ordinal, e in raw.complete():
        corr = (e.get("args") or {}).get("correlation")
        span = d.span_of_event(ordinal)
        if span is None or corr is None:
            continue
        if e.get("cat") in RUNTIME_CATEGORIES:
            launch.setdefault(corr, span.trace_id)
        elif e.get("cat") in KERNEL_CATEGORIES:
            device.append((corr, span.trace_id))
    linked = [(corr, tid) for corr, tid in device if corr in launch]
    assert linked
    assert all(launch[corr] == tid for corr, tid in linked)
    # each iteration holds its optimizer step and a share of the work; the window keeps little
    sizes = Counter(s.trace_id for s in d.spans)
    for root in roots:
        names = {s.name for s in d.by_trace[root.trace_id]}
        assert "Optimizer.step#SGD.step" in names
        assert sizes[root.trace_id] > (1000 if detail == "full" else 500)
        children = [s for s in d.by_trace[root.trace_id] if s.parent_id == root.span_id]
        assert any(not s.device for s in children)  # (kernels whose launch chain kept no span too)
    window = _window_root(d, roots[0])
    assert sizes[window.trace_id] < min(sizes[r.trace_id] for r in roots)
