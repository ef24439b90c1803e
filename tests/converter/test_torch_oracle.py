"""The installed torch is the oracle: convert traces it records right here and compare the
per-op aggregates with its own ``prof.key_averages()``."""

from __future__ import annotations

import pytest
from converter_helpers import Decoded, RawTrace, convert_cached, decode, fwdbwd_pairs, load_raw

pytest.importorskip("torch")
from torch_recordings import STEPS, Recording, recorded

pytestmark = [pytest.mark.torch, pytest.mark.slow]

PROFILES = [
    ("mlp_sgd", {}),
    ("convnet_adam", {"profile_memory": True}),
    ("transformer_adamw", {}),
    ("mlp_sgd", {"with_stack": True}),
    ("transformer_adamw", {"with_stack": True, "profile_memory": True}),
]


@pytest.fixture(scope="module", params=PROFILES, ids=lambda p: p[0] + "".join(f"+{k}" for k in p[1]))
def recording(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """One recording per profile for the session (both engines convert the same file)."""
    model, kwargs = request.param
    return recorded(tmp_path_factory, model, **kwargs)


def test_ops_match_key_averages(recording: Recording, engine: str) -> None:
    result = convert_cached(recording.path, engine, detail="full")
    ours = {(o.name, o.kind): o for o in result.ops if o.kind in ("op", "annotation")}
    theirs = {}
    for evt in recording.key_averages:
        if evt.key == "[memory]":
            continue
        key = (evt.key, "annotation" if evt.is_user_annotation else "op")
        assert key not in theirs
        theirs[key] = evt
    assert len(theirs) > 20
    problems = []
    for key, evt in theirs.items():
        row = ours.get(key)
        if row is None:
            problems.append(f"{key}: missing from ConvertResult.ops")
            continue
        self_us, total_us = row.self_cpu_ns / 1000, row.cpu_total_ns / 1000
        if row.calls != evt.count:
            problems.append(f"{key}: calls {row.calls} != torch count {evt.count}")
        if abs(self_us - evt.self_cpu_time_total) > 1.0:
            problems.append(f"{key}: self cpu {self_us} us != torch {evt.self_cpu_time_total} us")
        if abs(total_us - evt.cpu_time_total) > 1.0 * max(1, evt.count):
            problems.append(f"{key}: cpu total {total_us} us != torch {evt.cpu_time_total} us")
        if row.device_total_ns or row.self_device_ns:
            problems.append(f"{key}: device time on a CPU-only profile")
    extra = sorted(set(ours) - set(theirs))
    assert not extra, f"rows torch does not report: {extra}"
    assert not problems, "\n".join(problems)
    assert ("ProfilerStep*", "annotation") in ours and ours[("ProfilerStep*", "annotation")].calls == STEPS
    assert not [o for o in result.ops if o.kind == "device"]


def test_op_spans_carry_self_time(recording: Recording, engine: str) -> None:
    d = decode(convert_cached(recording.path, engine, detail="full"))
    ops = [s for s in d.spans if s.category in ("cpu_op", "user_annotation", "python_function")]
    assert ops
    total_self = sum(s.attrs["otelprof.op.self_cpu_time_ns"] for s in ops)
    assert total_self == sum(o.self_cpu_ns for o in d.result.ops)
    for s in ops:
        assert s.attrs["otelprof.op.self_cpu_time_ns"] <= s.end - s.start
        assert s.attrs["otelprof.op.self_device_time_ns"] == 0
        if s.category == "cpu_op":
            assert s.attrs["otelprof.op.self_cpu_time_ns"] >= 0
        # python frames can go negative, exactly as in torch: a record_function annotation opened
        # in __enter__ and closed in __exit__ overlaps both of them, so the frame's children
        # add up to more than the frame itself (key_averages shows the same negative self time)


def test_steps_and_fwdbwd_links(recording: Recording, engine: str) -> None:
    raw: RawTrace = load_raw(recording.path)
    d: Decoded = decode(convert_cached(recording.path, engine, detail="full"))
    steps = [s for s in d.spans if "otelprof.step.number" in s.attrs]
    assert len(steps) == STEPS
    assert all(not s.parent_id and s.name == f"ProfilerStep#{s.attrs['otelprof.step.number']}" for s in steps)
    assert len({s.trace_id for s in steps}) == STEPS
    assert d.resource["otelprof.run.id"] == raw.doc["trace_id"]
    pairs = fwdbwd_pairs(raw)
    assert len(pairs) >= STEPS, "torch records fwdbwd flows for autograd ops"
    links = [(s, lk) for s in d.spans for lk in s.links if lk.attrs.get("otelprof.link.kind") == "fwdbwd"]
    assert len(links) == len(pairs)
    for source, lk in links:
        target = d.by_id[lk.span_id]
        assert target.attrs["otelprof.op.sequence_number"] == source.attrs["otelprof.op.sequence_number"]
        assert target.start < source.start
        assert "Backward" in source.name or "backward" in source.name.lower()
        # forward and backward of a step are in that step's trace
        assert target.trace_id == source.trace_id == lk.trace_id
    # default detail keeps the links of ops it keeps, and never links an op to itself
    default = decode(convert_cached(recording.path, engine, detail="default"))
    for s in default.spans:
        for lk in s.links:
            assert lk.span_id != s.span_id and lk.span_id in default.by_id


def test_memory_events(recording: Recording, engine: str) -> None:
    raw = load_raw(recording.path)
    mem = [e for e in raw.events if e.get("ph") == "i" and e.get("name") == "[memory]"]
    d = decode(convert_cached(recording.path, engine, detail="full"))
    events = [(s, ev) for s in d.spans for ev in s.events]
    assert d.result.stats["memory_events"] == len(mem)
    assert len(events) == len(mem) - d.result.stats["memory_events_dropped"]
    if not mem:
        return
    assert sum(1 for s, _ in events if s.category == "cpu_op") > 0
    for s, ev in events:
        assert ev.name == "otelprof.memory" and isinstance(ev.attrs["otelprof.memory.bytes"], int)
        if s.category == "cpu_op":
            assert s.start <= ev.time <= s.end
    peaks = [s.attrs.get("otelprof.memory.peak_allocated_bytes") for s in d.spans if "otelprof.step.number" in s.attrs]
    assert all(isinstance(p, int) and p > 0 for p in peaks)
