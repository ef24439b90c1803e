"""``ConvertOptions.op_attributes`` (joined by Kineto's ``Record function id``) and the op span at
each device's memory peak: decoded against the raw trace, both engines, equal to each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from converter_helpers import (
    decode,
    load_raw,
    micros_to_ns,
    shared_trace,
    skip_unless_native,
)

from otelprof.converter import ConvertOptions, ConvertResult, convert
from otelprof.converter.reference._op_attrs import RECORD_FUNCTION_ID

H100 = "tracelens__tests__traces__h100"  # with memory events and record function ids
MI300 = "mi300__ddp_resnet18"
UNKNOWN_ID = 2**62  # no event has it


def _engines() -> list[Any]:
    return ["reference", pytest.param("native", marks=pytest.mark.native)]


def _convert(path: Path, engine: str, **fields: Any) -> ConvertResult:
    if engine == "native":
        skip_unless_native()
    return convert(path, engine=engine, options=ConvertOptions(**fields))


def _ops_by_id(path: Path) -> dict[int, list[tuple[str, int]]]:
    """Record function id -> (name, start ns) of the complete events that carry it."""
    raw = load_raw(path)
    out: dict[int, list[tuple[str, int]]] = {}
    for _k, e in raw.complete():
        rf = (e.get("args") or {}).get(RECORD_FUNCTION_ID)
        if isinstance(rf, int) and not isinstance(rf, bool):
            out.setdefault(rf, []).append((e["name"], raw.base_ns + micros_to_ns(e["ts"])))
    return out


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("detail", ["full", "default"])
@pytest.mark.parametrize("fragment", [H100, MI300])
def test_op_attributes_land_on_their_ops(fragment: str, detail: str, engine: str) -> None:
    path = shared_trace(fragment)
    ops = _ops_by_id(path)
    ids = sorted(ops)[::7]  # a spread of ids, each given its own values
    given: dict[int, list[tuple[str, Any]]] = {
        rf: [("otelprof.et.node_id", rf), ("test.tag", f"op {rf}"), ("test.flag", rf % 2 == 0), ("test.x", rf / 4)]
        for rf in ids
    }
    given[UNKNOWN_ID] = [("test.tag", "nobody")]
    result = _convert(path, engine, detail=detail, op_attributes=given)
    d = decode(result)
    joined = [s for s in d.spans if "otelprof.et.node_id" in s.attrs]
    for s in joined:
        rf = s.attrs["otelprof.et.node_id"]
        assert (s.name, s.start) in ops[rf] or any(s.attrs.get("otelprof.event.name") == n for n, _ in ops[rf])
        assert s.attrs["test.tag"] == f"op {rf}" and s.attrs["test.flag"] == (rf % 2 == 0)
        assert s.attrs["test.x"] == rf / 4
    stats = result.stats
    assert stats["op_attributes_joined"] == len(joined)
    assert stats["op_attributes_joined"] + stats["op_attributes_unplaced"] == sum(len(ops[rf]) for rf in ids)
    assert stats["op_attributes_unmatched"] == 1
    assert stats["op_attributes_missing"] == sum(len(v) for rf, v in ops.items() if rf not in given)
    assert not any(s.attrs.get("test.tag") == "nobody" for s in d.spans)
    if detail == "full":  # every event is a span of its own
        assert stats["op_attributes_unplaced"] == 0


@pytest.mark.native
@pytest.mark.parametrize("detail", ["full", "default"])
@pytest.mark.parametrize("fragment", [H100, MI300])
def test_engines_agree_on_op_attributes(fragment: str, detail: str) -> None:
    path = shared_trace(fragment)
    given = {rf: [("otelprof.et.node_id", rf), ("test.s", "\u00e9" * (rf % 5))] for rf in sorted(_ops_by_id(path))[::3]}
    given[-5] = [("test.neg", -1)]
    native = _convert(path, "native", detail=detail, op_attributes=given, attribute_value_length_limit=2)
    reference = _convert(path, "reference", detail=detail, op_attributes=given, attribute_value_length_limit=2)
    assert native.requests == reference.requests
    assert native.stats == reference.stats


def _memory_peaks(path: Path) -> dict[str, tuple[int, int]]:
    """Device -> (largest "Total Allocated", time of its first memory event)."""
    raw = load_raw(path)
    names = {0: "cpu", 1: "cuda"}
    peaks: dict[str, tuple[int, int]] = {}
    for e in raw.events:
        args = e.get("args") or {} if isinstance(e, dict) else {}
        if e.get("name") != "[memory]" or e.get("ph") not in ("i", "I") or "Total Allocated" not in args:
            continue
        kind, index = args["Device Type"], args.get("Device Id", -1)
        device = names[kind] if kind == 0 or index < 0 else f"{names[kind]}:{index}"
        total, ts = args["Total Allocated"], raw.base_ns + micros_to_ns(e["ts"])
        if device not in peaks or total > peaks[device][0]:
            peaks[device] = (total, ts)
    return peaks


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("detail", ["full", "default"])
@pytest.mark.parametrize("fragment", [H100, MI300])
def test_memory_peak_marks_the_op_holding_it(fragment: str, detail: str, engine: str) -> None:
    path = shared_trace(fragment)
    peaks = _memory_peaks(path)
    assert peaks
    d = decode(_convert(path, engine, detail=detail))
    marked = {s.attrs["otelprof.memory.peak_device"]: s for s in d.spans if "otelprof.memory.peak_bytes" in s.attrs}
    assert set(marked) <= set(peaks) and marked
    for device, s in marked.items():
        total, ts = peaks[device]
        assert s.attrs["otelprof.memory.peak_bytes"] == total
        assert s.start <= ts <= s.end
        # the span holding the memory event carries it as a span event
        assert any(ev.attrs.get("otelprof.memory.total_allocated_bytes") == total and ev.time == ts for ev in s.events)


@pytest.mark.parametrize("engine", _engines())
def test_memory_peak_on_a_fresh_torch_recording(tmp_path_factory: pytest.TempPathFactory, engine: str) -> None:
    pytest.importorskip("torch")
    from torch_recordings import recorded

    path = recorded(tmp_path_factory, "convnet_adam", profile_memory=True).path
    (total, ts), *_ = _memory_peaks(path).values()
    d = decode(_convert(path, engine, detail="full"))
    (s,) = [s for s in d.spans if "otelprof.memory.peak_bytes" in s.attrs]
    assert (s.attrs["otelprof.memory.peak_bytes"], s.attrs["otelprof.memory.peak_device"]) == (total, "cpu")
    assert s.category == "cpu_op" and s.start <= ts <= s.end
    # the innermost op on its thread whose interval holds the peak's memory event
    inner = [
        o
        for o in d.spans
        if o is not s
        and o.category == "cpu_op"
        and o.attrs.get("thread.id") == s.attrs.get("thread.id")
        and s.start <= o.start <= ts <= o.end <= s.end
    ]
    assert not inner


@pytest.mark.parametrize(
    "bad",
    [
        {1: [("", 1)]},  # no key
        {1: [("a", None)]},  # not an OTLP scalar
        {1: [("k" * 61, 1)]},  # longer than the native key table holds
        {True: [("a", 1)]},  # not an integer id
        {2**63: [("a", 1)]},  # past int64
        {1: "ab"},  # not a list of pairs
        [(1, 2)],  # not a mapping
    ],
)
def test_malformed_op_attributes_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="op_attributes"):
        ConvertOptions(op_attributes=bad)
