"""ConvertOptions: validation, and what each option does to the decoded output."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from converter_helpers import (
    Decoded,
    convert_cached,
    decode,
    load_raw,
    micros_to_ns,
    shared_trace,
)

from otelprof.converter import ConvertOptions, convert
from otelprof.otlp import ids

# --- validation -------------------------------------------------------------------------------

BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"detail": "verbose"}, "detail"),
    ({"detail": None}, "detail"),
    ({"detail": "FULL"}, "detail"),
    ({"min_duration_ns": -1}, "min_duration_ns"),
    ({"min_duration_ns": 1.5}, "min_duration_ns"),
    ({"min_duration_ns": True}, "min_duration_ns"),
    ({"min_duration_ns": 2**63}, "min_duration_ns"),
    ({"event_limit": -1}, "event_limit"),
    ({"event_limit": "10"}, "event_limit"),
    ({"link_limit": -5}, "link_limit"),
    ({"split_world_size": -1}, "split_world_size"),
    ({"max_request_bytes": 0}, "max_request_bytes"),
    ({"max_request_bytes": -1}, "max_request_bytes"),
    ({"max_request_bytes": 1023}, "max_request_bytes"),
    ({"max_request_bytes": 65536.0}, "max_request_bytes"),
    ({"rank": -1}, "rank"),
    ({"rank": "0"}, "rank"),
    ({"rank": False}, "rank"),
    ({"world_size": -8}, "world_size"),
    ({"base_time_ns": -1}, "base_time_ns"),
    ({"base_time_ns": 2**63}, "base_time_ns"),
    ({"run_id": 42}, "run_id"),
    ({"run_id": b"run"}, "run_id"),
    ({"resource_attributes": (("service.name", None),)}, "resource_attributes"),
    ({"resource_attributes": (("a", "b", "c"),)}, "resource_attributes"),
    ({"resource_attributes": (["a", "b"],)}, "resource_attributes"),
]


@pytest.mark.parametrize("fields,name", BAD_OPTIONS, ids=[f"{n}={f[n]!r}" for f, n in BAD_OPTIONS])
def test_bad_options_raise_value_error(fields: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        ConvertOptions(**fields)
    with pytest.raises(ValueError, match=name):  # the keyword form validates the same way
        convert(b'{"traceEvents": []}', engine="reference", **fields)


def test_good_options_and_defaults() -> None:
    o = ConvertOptions()
    assert o.detail == "default" and not o.full
    assert (o.min_duration_ns, o.event_limit, o.link_limit) == (10_000, 128, 128)
    assert o.max_request_bytes == 3 * 1024 * 1024
    assert o.split_world_size == 4
    full = ConvertOptions(detail="full", event_limit=3, link_limit=4)
    assert (full.span_event_limit, full.span_link_limit) == (0, 0)  # full detail keeps everything
    assert (ConvertOptions(event_limit=3).span_event_limit, ConvertOptions(link_limit=4).span_link_limit) == (3, 4)
    assert ConvertOptions(max_request_bytes=1024, min_duration_ns=0, rank=0, world_size=0, base_time_ns=0).rank == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.detail = "full"  # type: ignore[misc]
    native = ConvertOptions(rank=None, detail="full").as_native()
    assert native["rank"] == -1 and native["full"] is True and native["event_limit"] == 0


def test_convert_argument_errors() -> None:
    data = b'{"traceEvents": []}'
    with pytest.raises(TypeError):
        convert(data, options=ConvertOptions(), detail="full")
    with pytest.raises(TypeError):
        convert(data, no_such_option=1)
    with pytest.raises(ValueError, match="engine"):
        convert(data, engine="gpu")


# --- small hand-made traces -------------------------------------------------------------------


def _ev(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 2, **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = {k.replace("_", " "): v for k, v in args.items()}
    return ev


def _mem(ts: float, nbytes: int, total: int, device_type: int = 0, tid: int = 2) -> dict[str, Any]:
    return {
        "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts,
        "args": {"Total Reserved": 2 * total, "Total Allocated": total, "Bytes": nbytes, "Addr": 4096,
                 "Device Id": 0 if device_type else -1, "Device Type": device_type},
    }  # fmt: skip


def _trace(*events: dict[str, Any], **top: Any) -> bytes:
    return json.dumps({"traceEvents": list(events), **top}).encode()


def _by_name(d: Decoded) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in d.spans:
        assert s.name not in out, f"name {s.name!r} is not unique in this test trace"
        out[s.name] = s
    return out


def test_default_detail_drops_python_and_short_spans(engine: str) -> None:
    data = _trace(
        _ev("ProfilerStep#3", 0, 1000, cat="user_annotation"),
        _ev("aten::linear", 10, 100),
        _ev("model.py(12): forward", 11, 50, cat="python_function"),
        _ev("aten::t", 70, 1),  # 1 µs: under the 10 µs default
        _ev("aten::addmm", 80, 20),
        _ev("helper.py(3): f", 500, 30, cat="python_function"),
    )
    full = _by_name(decode(convert(data, engine=engine, detail="full")))
    assert set(full) == {
        "ProfilerStep#3",
        "aten::linear",
        "model.py(12): forward",
        "aten::t",
        "aten::addmm",
        "helper.py(3): f",
    }
    assert full["aten::t"].parent_id == full["aten::linear"].span_id
    result = convert(data, engine=engine, detail="default")
    kept = _by_name(decode(result))
    assert set(kept) == {"ProfilerStep#3", "aten::linear", "aten::addmm"}
    assert kept["aten::linear"].attrs["otelprof.hidden_spans"] == 2  # the python frame and aten::t
    assert kept["aten::linear"].attrs["otelprof.hidden"] == (
        "2 hidden (shorter than 10 µs, python functions): aten::t ×1, model.py(12): forward ×1"
    )
    assert kept["ProfilerStep#3"].attrs["otelprof.hidden_spans"] == 1  # helper.py
    assert kept["ProfilerStep#3"].attrs["otelprof.hidden"] == "1 hidden (python functions): helper.py(3): f ×1"
    assert "otelprof.hidden_spans" not in kept["aten::addmm"].attrs
    assert kept["aten::addmm"].parent_id == kept["aten::linear"].span_id
    assert (result.stats["dropped_python"], result.stats["dropped_short"]) == (2, 1)
    # with no minimum duration the short op stays; python frames still go
    kept0 = _by_name(decode(convert(data, engine=engine, detail="default", min_duration_ns=0)))
    assert set(kept0) == {"ProfilerStep#3", "aten::linear", "aten::t", "aten::addmm"}
    assert kept0["aten::linear"].attrs["otelprof.hidden_spans"] == 1
    # a larger minimum drops more
    kept_big = _by_name(decode(convert(data, engine=engine, detail="default", min_duration_ns=50_000)))
    assert set(kept_big) == {"ProfilerStep#3", "aten::linear"}
    assert kept_big["aten::linear"].attrs["otelprof.hidden_spans"] == 3
    hidden_big = kept_big["aten::linear"].attrs["otelprof.hidden"]
    assert hidden_big.startswith("3 hidden (shorter than 50 µs, python functions): ")


def test_default_detail_on_real_python_trace(engine: str) -> None:
    path = shared_trace("h100__gaunernst")
    raw = load_raw(path)
    n_python = sum(1 for _, e in raw.complete() if e.get("cat") == "python_function")
    assert n_python > 1000
    d = decode(convert_cached(path, engine, detail="default"))
    assert not any(s.category == "python_function" for s in d.spans)
    assert d.result.stats["dropped_python"] == n_python
    recorded = sum(s.attrs.get("otelprof.hidden_spans", 0) for s in d.spans)
    hidden = d.result.stats["dropped_python"] + d.result.stats["dropped_short"]
    # what ran outside the step is hidden under the window root, which is sent to say so:
    # every hidden event is counted by the span it folds into
    assert d.result.stats["dropped_window_roots"] == 0
    stats = d.result.stats
    assert recorded == hidden + stats["dropped_step_copies"] + stats["dropped_budget"] + stats["dropped_outside_step"]
    (root,) = [s for s in d.spans if s.name.startswith("PyTorch Profiler")]
    assert root.attrs["otelprof.folded.python.count"] > 0
    assert sum(1 for s in d.spans if "otelprof.hidden_spans" in s.attrs) >= 2
    full = decode(convert_cached(path, engine, detail="full"))
    assert sum(1 for s in full.spans if s.category == "python_function") == n_python
    assert len(d.spans) < len(full.spans) / 5


def test_aggregation_of_tiny_identical_siblings(engine: str) -> None:
    children = [_ev("aten::empty", 10 + 2 * k, 1 + 0.25 * k) for k in range(5)]
    data = _trace(
        _ev("aten::zeros", 0, 100),
        *children,
        _ev("aten::fill_", 30, 2),  # a single tiny op is dropped, not aggregated
        _ev("aten::view", 40, 1),
        _ev("aten::view", 42, 1, cat="user_annotation"),  # same name, other category: no run
    )
    result = convert(data, engine=engine, detail="default")
    d = decode(result)
    aggs = [s for s in d.spans if "otelprof.aggregated_count" in s.attrs]
    assert len(aggs) == 1
    (agg,) = aggs
    zeros = next(s for s in d.spans if s.name == "aten::zeros")
    assert agg.name == "aten::empty \N{MULTIPLICATION SIGN}5"
    assert agg.attrs["otelprof.aggregated_count"] == 5
    assert agg.attrs["otelprof.aggregated_duration_ns"] == sum(1000 + 250 * k for k in range(5))
    assert agg.attrs["otelprof.aggregated_self_ns"] == agg.attrs["otelprof.aggregated_duration_ns"]  # leaves
    assert (agg.attrs["otelprof.aggregated_min_ns"], agg.attrs["otelprof.aggregated_max_ns"]) == (1000, 2000)
    assert (agg.start, agg.end) == (10_000, 18_000 + 2_000)
    assert agg.parent_id == zeros.span_id and agg.trace_id == zeros.trace_id
    assert agg.attrs["otelprof.event.category"] == "cpu_op" and agg.attrs["thread.id"] == 2
    assert (result.stats["aggregate_spans"], result.stats["aggregated_events"]) == (1, 5)
    assert zeros.attrs["otelprof.hidden_spans"] == 3
    assert zeros.attrs["otelprof.hidden"] == "3 hidden (shorter than 10 µs): aten::view ×2, aten::fill_ ×1"
    # what they held, by class: two cpu_op and one user_annotation are all "op"
    assert (zeros.attrs["otelprof.folded.op.count"], zeros.attrs["otelprof.folded.op.duration_ns"]) == (3, 4000)
    assert {s.name for s in d.spans if not s.synthetic} == {"aten::zeros", "aten::empty \N{MULTIPLICATION SIGN}5"}
    # nothing is aggregated at full detail
    full = decode(convert(data, engine=engine, detail="full"))
    assert not any("otelprof.aggregated_count" in s.attrs for s in full.spans)


def test_aggregation_on_real_trace(engine: str) -> None:
    d = decode(convert_cached(shared_trace("critical_path__alexnet"), engine, detail="default"))
    aggs = [s for s in d.spans if "otelprof.aggregated_count" in s.attrs]
    assert len(aggs) >= 10
    assert all(s.attrs["otelprof.aggregated_count"] >= 2 for s in aggs)
    assert sum(s.attrs["otelprof.aggregated_count"] for s in aggs) == d.result.stats["aggregated_events"]
    for s in aggs:
        parent = d.by_id[s.parent_id]
        assert parent.start <= s.start and s.end <= parent.end


# --- trace ids ----------------------------------------------------------------------------------


def _step_span(d: Decoded, number: int) -> Any:
    return next(s for s in d.spans if s.attrs.get("otelprof.step.number") == number and not s.synthetic)


def test_run_id_determines_step_trace_ids(engine: str) -> None:
    a, b = shared_trace("cpu_only__rank-34"), shared_trace("trace_filter__sampled_rank-0")  # both record step 551
    da = decode(convert(a, engine=engine, run_id="job-1"))
    db = decode(convert(b, engine=engine, run_id="job-1"))
    assert _step_span(da, 551).trace_id == _step_span(db, 551).trace_id == ids.trace_id("step|job-1|551")
    assert _step_span(db, 552).trace_id == ids.trace_id("step|job-1|552")
    dc = decode(convert(a, engine=engine, run_id="job-2"))
    assert _step_span(dc, 551).trace_id != _step_span(da, 551).trace_id
    assert da.resource["otelprof.run.id"] == "job-1"
    # same run, same rank: identical output; another rank: same step trace, other span ids
    again = convert(a, engine=engine, run_id="job-1")
    assert again.requests == da.result.requests
    other_rank = decode(convert(a, engine=engine, run_id="job-1", rank=35))
    assert other_rank.resource["otelprof.distributed.rank"] == 35
    assert _step_span(other_rank, 551).trace_id == _step_span(da, 551).trace_id
    assert _step_span(other_rank, 551).span_id != _step_span(da, 551).span_id


def test_run_id_defaults_to_trace_metadata(engine: str) -> None:
    path = shared_trace("h100__gaunernst")
    d = decode(convert_cached(path, engine, detail="default"))
    assert d.resource["otelprof.run.id"] == load_raw(path).doc["trace_id"]
    assert _step_span(d, 6).trace_id == ids.trace_id(f"step|{load_raw(path).doc['trace_id']}|6")


def test_split_world_size(engine: str) -> None:
    path = shared_trace("trace_filter__sampled_rank-0")  # world size 128
    split = decode(convert(path, engine=engine, detail="default"))
    assert any(s.synthetic for s in split.spans)
    assert any(lk.attrs.get("otelprof.link.kind") == "rank_detail" for s in split.spans for lk in s.links)
    flat = decode(convert(path, engine=engine, detail="default", split_world_size=0))
    assert not any(s.synthetic and not s.name.startswith("gpu ") for s in flat.spans)  # GPU lanes only
    assert not any(lk.attrs.get("otelprof.link.kind") in ("rank_detail", "step") for s in flat.spans for lk in s.links)
    step = _step_span(flat, 551)
    assert len(flat.by_trace[step.trace_id]) > 100  # the step's detail lives in the step trace
    # a small world stays flat; a large one given as an option splits
    small = decode(convert(shared_trace("amd_trace__mi250"), engine=engine, world_size=2))
    assert not any(s.synthetic and not s.name.startswith("gpu ") for s in small.spans)
    big = decode(convert(shared_trace("amd_trace__mi250"), engine=engine, world_size=64))
    assert big.resource["otelprof.distributed.world_size"] == 64
    assert sum(1 for s in big.spans if s.synthetic) == 2  # one detail root per step


def test_base_time_override(engine: str) -> None:
    path = shared_trace("amd_trace__mi250")
    raw = load_raw(path)
    assert raw.base_ns > 0
    d = decode(convert(path, engine=engine, detail="full", base_time_ns=0))
    default = decode(convert_cached(path, engine, detail="full"))
    ordinal, e = next(iter(raw.complete()))
    shifted, kept = d.span_of_event(ordinal), default.span_of_event(ordinal)
    assert shifted is not None and kept is not None
    assert shifted.start == micros_to_ns(e["ts"])
    assert kept.start == raw.base_ns + micros_to_ns(e["ts"])


# --- resource -------------------------------------------------------------------------------------


def test_resource_defaults_from_trace(engine: str) -> None:
    h100 = decode(convert_cached(shared_trace("h100__gaunernst"), engine, detail="full"))
    res = h100.resource
    assert res["service.name"] == "unknown_service"
    assert res["otelprof.gpu.model"] == "NVIDIA H100 80GB HBM3"
    assert res["otelprof.gpu.count"] == 1
    assert res["telemetry.sdk.name"] == "otelprof" and res["telemetry.sdk.language"] == "python"
    assert "otelprof.distributed.rank" not in res  # this trace has no distributedInfo
    assert next(iter(res)) == "service.name"
    dlrm = decode(convert_cached(shared_trace("dlrm_kineto__worker1"), engine, detail="full")).resource
    assert (dlrm["otelprof.distributed.rank"], dlrm["otelprof.distributed.world_size"]) == (1, 8)
    assert dlrm["otelprof.distributed.backend"] == "nccl"
    assert dlrm["otelprof.gpu.count"] == len(load_raw(shared_trace("dlrm_kineto__worker1")).doc["deviceProperties"])
    cpu = decode(convert_cached(shared_trace("cpu_only__rank-34"), engine, detail="full")).resource
    assert (cpu["otelprof.distributed.rank"], cpu["otelprof.distributed.world_size"]) == (34, 300)
    assert cpu["otelprof.distributed.backend"] == "gloo"


def test_resource_attributes_given_first(engine: str) -> None:
    given = (("deployment.environment", "ci"), ("service.name", "trainer"), ("host.name", "given-host"), ("k", "v"))
    d = decode(
        convert(
            shared_trace("dlrm_kineto__worker0"), engine=engine, detail="default", resource_attributes=given,
            host_name="option-host", scope_version="1.2.3", rank=5, world_size=16,
        )
    )  # fmt: skip
    keys = list(d.resource)
    assert keys[: len(given)] == [k for k, _ in given]
    assert [d.resource[k] for k, _ in given] == [v for _, v in given]  # given values win over computed ones
    assert keys.count("host.name") == 1 and keys.count("service.name") == 1
    assert d.resource["telemetry.sdk.version"] == "1.2.3"
    assert (d.resource["otelprof.distributed.rank"], d.resource["otelprof.distributed.world_size"]) == (5, 16)
    assert d.scope_name == "otelprof" and d.scope_version == "1.2.3"
    hosted = decode(convert(shared_trace("cpu_only__rank-34"), engine=engine, host_name="option-host")).resource
    assert hosted["host.name"] == "option-host"
    assert next(iter(hosted)) == "service.name"


# --- span events: memory ----------------------------------------------------------------------------


def test_memory_events_on_innermost_op(engine: str) -> None:
    data = _trace(
        _ev("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        _ev("aten::empty", 10, 100),
        _ev("aten::zero_", 20, 5),  # 5 µs: dropped at default detail
        _mem(22, 256, 1_000),
        _mem(50, 1024, 2_000),
        _mem(60, 4096, 9_000, device_type=1),
        _mem(70, -4096, 5_000, device_type=1),
        _mem(500, 64, 3_000),
    )
    full = _by_name(decode(convert(data, engine=engine, detail="full")))
    zero, empty, step = full["aten::zero_"], full["aten::empty"], full["ProfilerStep#1"]
    assert [(ev.name, ev.time, ev.attrs["otelprof.memory.bytes"]) for ev in zero.events] == [
        ("otelprof.memory", 22_000, 256)
    ]
    assert [(ev.time, ev.attrs["otelprof.memory.bytes"]) for ev in empty.events] == [
        (50_000, 1024),
        (60_000, 4096),
        (70_000, -4096),
    ]
    assert empty.events[1].attrs == {
        "otelprof.memory.bytes": 4096, "otelprof.memory.total_allocated_bytes": 9_000,
        "otelprof.memory.total_reserved_bytes": 18_000, "otelprof.memory.device_type": 1,
        "otelprof.memory.device_id": 0, "otelprof.memory.device": "cuda:0", "otelprof.memory.addr": "0x1000",
    }  # fmt: skip
    assert list(empty.events[1].attrs)[-2:] == ["otelprof.memory.device", "otelprof.memory.addr"]
    assert (zero.events[0].attrs["otelprof.memory.device"], zero.events[0].attrs["otelprof.memory.device_id"]) == (
        "cpu",
        -1,
    )
    assert [ev.time for ev in step.events] == [500_000]
    assert step.attrs["otelprof.memory.peak_allocated_bytes"] == 9_000  # accelerator peak wins over CPU
    default = _by_name(decode(convert(data, engine=engine, detail="default")))
    assert [ev.time for ev in default["aten::empty"].events] == [22_000, 50_000, 60_000, 70_000]
    limited = convert(data, engine=engine, detail="default", event_limit=2)
    emp = _by_name(decode(limited))["aten::empty"]
    assert [ev.time for ev in emp.events] == [22_000, 50_000]
    assert emp.dropped_events == 2
    assert limited.stats["memory_events_dropped"] == 2


def test_memory_peak_cpu_only(engine: str) -> None:
    data = _trace(
        _ev("ProfilerStep#9", 0, 100, cat="user_annotation"), _mem(10, 8, 700), _mem(20, 8, 300), _mem(200, 8, 5000)
    )
    step = _by_name(decode(convert(data, engine=engine, detail="full")))["ProfilerStep#9"]
    assert step.attrs["otelprof.memory.peak_allocated_bytes"] == 700


def test_memory_events_on_real_trace(engine: str) -> None:
    path = shared_trace("h100__gaunernst")
    raw = load_raw(path)
    mem = [e for e in raw.events if e.get("ph") == "i" and e.get("name") == "[memory]"]
    d = decode(convert_cached(path, engine, detail="full"))
    events = [ev for s in d.spans for ev in s.events]
    assert d.result.stats["memory_events"] == len(mem) > 100
    assert len(events) == len(mem) - d.result.stats["memory_events_dropped"]
    assert all(ev.name == "otelprof.memory" and "otelprof.memory.bytes" in ev.attrs for ev in events)
    assert sorted(ev.attrs["otelprof.memory.bytes"] for ev in events) == sorted(m["args"]["Bytes"] for m in mem)
    names = {0: "cpu", 1: "cuda"}
    assert sorted((ev.attrs["otelprof.memory.addr"], ev.attrs["otelprof.memory.device"]) for ev in events) == sorted(
        (
            hex(m["args"]["Addr"]),
            names[m["args"]["Device Type"]] + (f":{m['args']['Device Id']}" if m["args"]["Device Type"] else ""),
        )
        for m in mem
    )
    ops_with_memory = [s for s in d.spans if s.events and s.category == "cpu_op"]
    assert ops_with_memory
    for s in d.spans:
        for ev in s.events:  # an op's memory events happen while it runs
            if s.category == "cpu_op":
                assert s.start <= ev.time <= s.end
    # the step carries its peak: accelerator allocations inside the step
    step_ev = next(
        e for _, e in raw.complete() if e.get("name") == "ProfilerStep#6" and e.get("cat") == "user_annotation"
    )
    s0 = micros_to_ns(step_ev["ts"])
    s1 = s0 + micros_to_ns(step_ev["dur"])
    inside = [m for m in mem if s0 <= micros_to_ns(m["ts"]) < s1]
    accel = [m["args"]["Total Allocated"] for m in inside if m["args"].get("Device Type")]
    expected = max(accel) if accel else max(m["args"]["Total Allocated"] for m in inside)
    assert _step_span(d, 6).attrs["otelprof.memory.peak_allocated_bytes"] == expected


# --- links --------------------------------------------------------------------------------------------


def test_fwdbwd_flow_links_and_link_limit(engine: str) -> None:
    flow = {"cat": "fwdbwd", "pid": 1, "tid": 2, "bp": "e"}
    data = _trace(
        _ev("aten::linear", 0, 50, Sequence_number=7),
        _ev("aten::mul", 100, 50, Sequence_number=8),
        _ev("autograd::engine::evaluate_function: MulBackward0", 300, 80, Sequence_number=8, Fwd_thread_id=2),
        {**flow, "ph": "s", "id": 1, "ts": 0},
        {**flow, "ph": "s", "id": 2, "ts": 100},
        {**flow, "ph": "f", "id": 1, "ts": 300},
        {**flow, "ph": "f", "id": 2, "ts": 300},
        {**flow, "ph": "s", "id": 3, "ts": 100},  # a start without an end: no link
    )
    result = convert(data, engine=engine, detail="default")
    spans = _by_name(decode(result))
    bwd = spans["autograd::engine::evaluate_function: MulBackward0"]
    assert [(lk.span_id, lk.attrs["otelprof.link.kind"]) for lk in bwd.links] == [
        (spans["aten::linear"].span_id, "fwdbwd"),
        (spans["aten::mul"].span_id, "fwdbwd"),
    ]
    assert all(lk.trace_id == spans["aten::linear"].trace_id for lk in bwd.links)
    assert result.stats["links"] == 2
    limited = convert(data, engine=engine, detail="default", link_limit=1)
    bwd = _by_name(decode(limited))["autograd::engine::evaluate_function: MulBackward0"]
    assert len(bwd.links) == 1 and bwd.dropped_links == 1
    assert limited.stats["links_dropped"] == 1


def test_sequence_number_links_without_flows(engine: str) -> None:
    data = _trace(
        _ev("aten::mul", 0, 50, Sequence_number=8, Fwd_thread_id=0),
        _ev("aten::add", 60, 50, Sequence_number=9),
        _ev("MulBackward0", 300, 80, tid=3, Sequence_number=8, Fwd_thread_id=2),
        _ev("AddBackward0", 400, 80, tid=3, Sequence_number=9, Fwd_thread_id=2),
        _ev("SubBackward0", 500, 80, tid=3, Sequence_number=10, Fwd_thread_id=2),  # no forward: no link
    )
    spans = _by_name(decode(convert(data, engine=engine, detail="full")))
    assert [lk.span_id for lk in spans["MulBackward0"].links] == [spans["aten::mul"].span_id]
    assert [lk.span_id for lk in spans["AddBackward0"].links] == [spans["aten::add"].span_id]
    assert spans["SubBackward0"].links == []


# --- ops (key_averages rows) --------------------------------------------------------------------------


def test_group_by_input_shapes(engine: str) -> None:
    data = _trace(
        _ev("aten::add", 0, 10, Input_Dims=[[2, 3], [2, 3]]),
        _ev("aten::add", 20, 30, Input_Dims=[[4], [4]]),
        _ev("aten::add", 60, 5, Input_Dims=[[2, 3], [2, 3]]),
    )
    plain = convert(data, engine=engine, detail="full").ops
    assert [(o.name, o.kind, o.input_shapes, o.calls, o.cpu_total_ns) for o in plain] == [
        ("aten::add", "op", "", 3, 45_000)
    ]
    grouped = convert(data, engine=engine, detail="full", group_by_input_shapes=True).ops
    assert sorted((o.input_shapes, o.calls, o.self_cpu_ns) for o in grouped) == [
        ("[[2,3],[2,3]]", 2, 15_000),
        ("[[4],[4]]", 1, 30_000),
    ]


def test_lone_surrogates_in_option_strings(engine: str) -> None:
    """Strings from the caller may hold lone surrogates (e.g. from os.fsdecode); they are
    replaced by U+FFFD in the output and ids stay deterministic."""
    path = shared_trace("cpu_only__rank-34")
    fields: dict[str, Any] = {
        "run_id": "run-\ud800",
        "resource_attributes": (("team", "t\udc00"),),
        "host_name": "h\ud800",
        "scope_version": "v\udfff",
    }
    d = decode(convert(path, engine=engine, **fields))
    assert d.resource["otelprof.run.id"] == "run-\ufffd"
    assert d.resource["team"] == "t\ufffd"
    assert d.scope_version == "v\ufffd"
    assert _step_span(d, 551).trace_id == ids.trace_id("step|run-\ufffd|551")  # the cleaned run id
    assert convert(path, engine=engine, **fields).requests == d.result.requests
