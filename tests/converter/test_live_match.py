"""Live steps matched to a trace's ``ProfilerStep#N`` markers by time (``live_match="time"``):
a user's own torch.profiler numbers its steps itself, so the live step that overlaps a marker
most takes it, whatever the numbers; ``"number"`` (the default) matches ignoring the live steps'
times (either way a marker is then cut to its live step: test_live_nesting.py). Both engines give
the same bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import (
    DSpan,
    all_spans_pb,
    convert_cached,
    decode,
    shared_trace,
    skip_unless_native,
)

from otelprof.converter import ConvertOptions, ConvertResult, LiveStep, convert, convert_bytes
from otelprof.converter._options import Detail
from otelprof.otlp import ids

RUN = "run-live"
US = 1000  # ns per µs: the trace's timestamps are µs, the live steps' ns


def _h(text: str, size: int) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:size]


def _event(name: str, cat: str, ts: int, dur: int, tid: int = 7) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def _trace(events: list[dict[str, Any]]) -> bytes:
    return json.dumps({"traceEvents": events}).encode()


# ProfilerStep#3 [1000, 2000) µs and ProfilerStep#4 [2000, 3000) µs, each with a forward op
# (which has a child), a backward op and an op that overlaps no phase; #4 comes first in the file.
STEP_EVENTS = [
    _event("ProfilerStep#4", "user_annotation", 2000, 1000),
    _event("aten::fwd4", "cpu_op", 2100, 300),
    _event("aten::inner4", "cpu_op", 2150, 100),
    _event("aten::bwd4", "cpu_op", 2500, 400),
    _event("ProfilerStep#3", "user_annotation", 1000, 1000),
    _event("aten::fwd3", "cpu_op", 1100, 300),
    _event("aten::inner3", "cpu_op", 1150, 100),
    _event("aten::bwd3", "cpu_op", 1500, 400),
    _event("aten::tail3", "cpu_op", 1960, 30),
]
STEPS = _trace(STEP_EVENTS)


def _phases(number: int, start: int, mid: int, end: int) -> tuple[tuple[bytes, int, int], ...]:
    return ((_h(f"fwd|{number}", 8), start, mid), (_h(f"bwd|{number}", 8), mid, end))


def _live(
    number: int, start: int, end: int, phases: tuple[tuple[bytes, int, int], ...] = (), trigger: str = ""
) -> LiveStep:
    return LiveStep(
        number, _h(f"trace|{number}", 16), _h(f"step|{number}", 8), phases, trigger, start_ns=start, end_ns=end
    )


# A decoy numbered like ProfilerStep#3 that overlaps nothing, a live step that overlaps both
# markers less than 41 and 42 do, and the two that overlap them most (phases end at 1950 µs, so
# aten::tail3 overlaps none).
DECOY = _live(3, 10_000 * US, 11_000 * US, _phases(3, 10_000 * US, 10_500 * US, 11_000 * US), "anomaly")
LESSER = _live(40, 1900 * US, 2300 * US, _phases(40, 1900 * US, 2000 * US, 2300 * US))
LIVE_41 = _live(41, 950 * US, 2050 * US, _phases(41, 950 * US, 1450 * US, 1950 * US), "on_demand")
LIVE_42 = _live(42, 2050 * US, 3100 * US, _phases(42, 2050 * US, 2450 * US, 3100 * US))
LIVE = (DECOY, LESSER, LIVE_41, LIVE_42)


def _both(data: bytes, options: ConvertOptions) -> ConvertResult:
    """The native result, checked byte for byte against the reference's."""
    skip_unless_native()
    native = convert_bytes(data, options, engine="native")
    reference = convert_bytes(data, options, engine="reference")
    assert native.engine == "native" and reference.engine == "reference"
    assert native.requests == reference.requests
    assert native.stats == reference.stats
    assert native.ops == reference.ops
    return native


def _by_name(result: ConvertResult) -> dict[str, DSpan]:
    spans = decode(result).spans
    named = {s.name: s for s in spans}
    assert len(named) == len(spans)
    return named


@pytest.mark.parametrize("detail", ["full", "default"])
def test_markers_go_under_the_live_steps_they_overlap_most(detail: Detail) -> None:
    options = ConvertOptions(run_id=RUN, detail=detail, live_steps=LIVE, live_match="time")
    spans = _by_name(_both(STEPS, options))
    for marker, live, number in (("ProfilerStep#3", LIVE_41, 3), ("ProfilerStep#4", LIVE_42, 4)):
        s = spans[marker]
        assert (s.trace_id, s.parent_id) == (live.trace_id, live.span_id), marker
        assert s.attrs["otelprof.step.number"] == number  # the marker keeps its own name and number
        assert s.attrs.get("otelprof.window.trigger") == (live.trigger or None)
        fwd, bwd = (p[0] for p in live.phases)
        assert spans[f"aten::fwd{number}"].parent_id == fwd
        assert spans[f"aten::bwd{number}"].parent_id == bwd
        assert spans[f"aten::inner{number}"].parent_id == spans[f"aten::fwd{number}"].span_id
        assert all(spans[f"aten::{op}{number}"].trace_id == live.trace_id for op in ("fwd", "inner", "bwd"))
    assert spans["aten::tail3"].parent_id == LIVE_41.phases[1][0]  # overlaps no phase: the one before it
    # cut to the live step where it outlives it ([2000, 3000) µs in [2050, 3100] µs)
    assert (spans["ProfilerStep#4"].start, spans["ProfilerStep#4"].end) == (2050 * US, 3000 * US)
    assert (spans["ProfilerStep#3"].start, spans["ProfilerStep#3"].end) == (1000 * US, 2000 * US)
    trace_ids = {s.trace_id for s in spans.values()}
    assert trace_ids == {LIVE_41.trace_id, LIVE_42.trace_id}  # none in the decoy's or the lesser's trace
    assert not [s.name for s in spans.values() if not s.parent_id]  # the live spans are the roots


def test_number_mode_ignores_the_times() -> None:
    """By number, ProfilerStep#3 takes the decoy numbered 3 and #4 no live step, whatever the
    intervals say (the decoy's, overlapping no part of the marker, cuts nothing); with the
    times zeroed the bytes are the same, and the default is "number"."""
    options = ConvertOptions(run_id=RUN, detail="full", live_steps=LIVE)
    assert options.live_match == "number"
    result = _both(STEPS, options)
    spans = _by_name(result)
    assert (spans["ProfilerStep#3"].trace_id, spans["ProfilerStep#3"].parent_id) == (DECOY.trace_id, DECOY.span_id)
    assert spans["ProfilerStep#3"].attrs["otelprof.window.trigger"] == "anomaly"
    assert spans["aten::fwd3"].parent_id == DECOY.phases[0][0]  # overlapping no phase: the first after it
    assert (spans["ProfilerStep#3"].start, spans["ProfilerStep#3"].end) == (1000 * US, 2000 * US)
    assert spans["ProfilerStep#4"].parent_id == b""
    assert spans["ProfilerStep#4"].trace_id == ids.trace_id(f"step|{RUN}|4")
    untimed = tuple(dataclasses.replace(ls, start_ns=0, end_ns=0) for ls in LIVE)
    explicit = dataclasses.replace(options, live_steps=untimed, live_match="number")
    assert convert_bytes(STEPS, explicit, engine="native").requests == result.requests
    assert convert_bytes(STEPS, explicit, engine="reference").requests == result.requests


def test_time_mode_without_times_matches_nothing() -> None:
    untimed = tuple(dataclasses.replace(ls, start_ns=0, end_ns=0) for ls in LIVE)
    options = ConvertOptions(run_id=RUN, detail="full", live_steps=untimed, live_match="time")
    assert _both(STEPS, options).requests == _both(STEPS, ConvertOptions(run_id=RUN, detail="full")).requests


def test_markers_take_live_steps_in_order_of_start() -> None:
    """One live step that overlaps #4 (first in the file) more than #3: #3 starts first and takes
    it, and a live step goes to one marker only, so #4 keeps its own trace. #3 is cut to the
    live step's last 10 µs of it, and its operators, all before, are no spans."""
    wide = _live(9, 1990 * US, 2900 * US)
    result = _both(STEPS, ConvertOptions(run_id=RUN, detail="full", live_steps=(wide,), live_match="time"))
    spans = _by_name(result)
    assert (spans["ProfilerStep#3"].trace_id, spans["ProfilerStep#3"].parent_id) == (wide.trace_id, wide.span_id)
    assert (spans["ProfilerStep#3"].start, spans["ProfilerStep#3"].end) == (1990 * US, 2000 * US)
    assert spans["ProfilerStep#4"].parent_id == b""
    assert spans["ProfilerStep#4"].trace_id == ids.trace_id(f"step|{RUN}|4")
    assert not {"aten::fwd3", "aten::inner3", "aten::bwd3", "aten::tail3"} & set(spans)
    assert result.stats["dropped_outside_step"] == 4
    assert spans["aten::fwd4"].parent_id == spans["ProfilerStep#4"].span_id  # no live step: untouched


def test_equal_overlaps_go_to_the_first_live_step_given() -> None:
    a, b = _live(7, 1500 * US, 2500 * US), _live(8, 1500 * US, 2500 * US)  # each overlaps #3 and #4 by 500 µs
    spans = _by_name(_both(STEPS, ConvertOptions(run_id=RUN, detail="full", live_steps=(b, a), live_match="time")))
    assert spans["ProfilerStep#3"].parent_id == b.span_id
    assert spans["ProfilerStep#4"].parent_id == a.span_id


def test_equal_starts_go_in_trace_order() -> None:
    """Two markers that start together (on two threads): the first in the file picks first."""
    events = [
        _event("ProfilerStep#6", "user_annotation", 1000, 500, tid=8),
        _event("ProfilerStep#5", "user_annotation", 1000, 1000, tid=7),
    ]
    short, long_ = _live(1, 1000 * US, 1500 * US), _live(2, 1000 * US, 2000 * US)
    options = ConvertOptions(run_id=RUN, detail="full", live_steps=(long_, short), live_match="time")
    spans = _by_name(_both(_trace(events), options))
    assert spans["ProfilerStep#6"].parent_id == long_.span_id  # overlaps both by 500 µs: the first given
    assert spans["ProfilerStep#5"].parent_id == short.span_id


def test_touching_intervals_do_not_overlap() -> None:
    touching = _live(1, 3000 * US, 4000 * US)  # starts where ProfilerStep#4 ends
    options = ConvertOptions(run_id=RUN, detail="full", live_steps=(touching,), live_match="time")
    assert _both(STEPS, options).requests == _both(STEPS, ConvertOptions(run_id=RUN, detail="full")).requests


def test_split_detail_traces_take_no_live_steps() -> None:
    split = ConvertOptions(run_id=RUN, detail="full", world_size=64, split_world_size=2)
    with_live = dataclasses.replace(split, live_steps=LIVE, live_match="time")
    assert _both(STEPS, with_live).requests == _both(STEPS, split).requests


@pytest.mark.native
@pytest.mark.parametrize("fragment", ["cpu_only__rank-34", "h100__gaunernst", "amd_trace__mi250"])
@pytest.mark.parametrize("detail", ["full", "default"])
def test_shared_traces_match_reference_by_time(fragment: str, detail: Detail) -> None:
    """Live steps numbered 1000 + k, given in reverse, each a little wider than its marker, with
    four phases tiling it: every marker goes under its own, in both engines alike."""
    path: Path = shared_trace(fragment)
    found: dict[int, tuple[int, int]] = {}
    for s in all_spans_pb(convert_cached(path, "reference", detail="full").requests):
        if s.name.startswith("ProfilerStep#") and not s.parent_span_id:
            found.setdefault(int(s.name.split("#")[1]), (s.start_time_unix_nano, s.end_time_unix_nano))
    markers = sorted(found.items(), key=lambda kv: kv[1])
    assert markers, path
    live = []
    for k, (_, (start, end)) in enumerate(markers):
        cuts = [start + (end - start) * q // 4 for q in range(5)]
        phases = tuple((_h(f"{k}|{q}", 8), cuts[q], cuts[q + 1]) for q in range(4))
        live.append(_live(1000 + k, max(start - 10, 0), end + 10, phases, ("early", "")[k % 2]))
    options = ConvertOptions(detail=detail, world_size=1, live_steps=tuple(reversed(live)), live_match="time")
    skip_unless_native()
    native = convert(path, engine="native", options=options)
    reference = convert(path, engine="reference", options=options)
    assert native.requests == reference.requests
    assert native.stats == reference.stats and native.ops == reference.ops
    spans = all_spans_pb(native.requests)
    under_phases = 0
    for (number, _), ls in zip(markers, live, strict=True):
        [marker] = [s for s in spans if s.name == f"ProfilerStep#{number}" and s.parent_span_id == ls.span_id]
        assert marker.trace_id == ls.trace_id
        phase_ids = {p[0] for p in ls.phases}
        under_phases += sum(s.parent_span_id in phase_ids for s in spans if s.trace_id == ls.trace_id)
    assert under_phases  # (a step may have no CPU span directly under its marker)


def test_bad_live_match_raises() -> None:
    with pytest.raises(ValueError, match="live_match"):
        ConvertOptions(live_match="nearest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="live_match"):
        convert(STEPS, live_match="Time")


def test_native_core_rejects_a_bad_live_match() -> None:
    skip_unless_native()
    from otelprof._native_module import native

    assert native is not None
    options = ConvertOptions().as_native()
    assert options["live_match"] == "number"
    options["live_match"] = "nearest"
    with pytest.raises(ValueError, match="live_match"):
        native.convert(STEPS, options)


@pytest.mark.parametrize(
    "start,end",
    [(-1, 0), (0, -1), (5, 4), (0, 2**63), (2**63, 2**63), (1.0, 2), (0, True), ("0", 1)],
)
def test_bad_live_step_interval_raises(start: Any, end: Any) -> None:
    with pytest.raises(ValueError, match="malformed live step"):
        LiveStep(1, bytes(16), bytes(8), start_ns=start, end_ns=end)


def test_live_step_interval_bounds() -> None:
    assert LiveStep(1, bytes(16), bytes(8)).start_ns == 0
    ls = LiveStep(1, bytes(16), bytes(8), start_ns=2**63 - 1, end_ns=2**63 - 1)
    assert ConvertOptions(live_steps=(ls,)).as_native()["live_steps"] == [
        (1, bytes(16), bytes(8), [], "", 2**63 - 1, 2**63 - 1)
    ]
