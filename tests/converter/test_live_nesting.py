"""A profiled step nests inside its live step: ``ProfilerStep#N`` is cut to the live step's
``[start_ns, end_ns]`` (otelprof's own range ends in the callback after the step has ended), the
CPU events its range held wholly outside that interval are not spans (``dropped_outside_step``),
and an operator that overlaps no phase (the loss, between the forward and the backward) goes
under the phase that ran last before it. Both engines give the same bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import DSpan, all_spans_pb, convert_cached, decode, shared_trace, skip_unless_native

from otelprof.converter import ConvertOptions, ConvertResult, LiveStep, convert, convert_bytes
from otelprof.converter._options import Detail, LiveMatch

RUN = "run-nesting"
US = 1000  # ns per µs: the trace's timestamps are µs, the live steps' ns
DROP_KEYS = ("dropped_python", "dropped_short", "dropped_budget", "dropped_step_copies", "dropped_window_roots")


def _h(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _event(name: str, ts: float, dur: float, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 7, "ts": ts, "dur": dur, "args": {}}


# ProfilerStep#5's range [1000, 2000) µs outlives its live step [1100, 1900) µs at both ends, as
# otelprof's own range does: the head and the tail hold work of no step.
TRACE = json.dumps(
    {
        "traceEvents": [
            _event("ProfilerStep#5", 1000, 1000, "user_annotation"),
            _event("head", 1010, 80),
            _event("head_child", 1020, 10),
            _event("pre", 1110, 30),  # before every phase
            _event("fetch", 1160, 30),
            _event("linear", 1210, 180),
            _event("view", 1395, 0),  # zero length, inside the forward
            _event("mse_loss", 1420, 60),  # between the forward and the backward
            _event("sub", 1430, 10),
            _event("bwd_op", 1510, 180),
            _event("sgd_step", 1710, 80),
            _event("zero_grad", 1820, 30),  # after the update
            _event("straddle", 1880, 25),  # begins in the step, ends after it: kept
            _event("tail", 1910, 5),
            _event("tail", 1920, 5),
        ]
    }
).encode()
PHASES = {"data": (1150, 1200), "forward": (1200, 1400), "backward": (1500, 1700), "optimizer": (1700, 1800)}
OUTSIDE = {"head", "head_child", "tail"}
UNDER = {
    "pre": "data",
    "fetch": "data",
    "linear": "forward",
    "view": "forward",
    "mse_loss": "forward",
    "bwd_op": "backward",
    "sgd_step": "optimizer",
    "zero_grad": "optimizer",
    "straddle": "optimizer",
}


def _live(start: int = 1100 * US, end: int = 1900 * US, phases: bool = True, number: int = 5) -> LiveStep:
    given = tuple((_h(name)[:8], lo * US, hi * US) for name, (lo, hi) in PHASES.items()) if phases else ()
    return LiveStep(number, _h("trace")[:16], _h("step")[:8], given, start_ns=start, end_ns=end)


def _both(options: ConvertOptions, data: bytes = TRACE) -> ConvertResult:
    """The native result, checked byte for byte against the reference's."""
    skip_unless_native()
    native = convert_bytes(data, options, engine="native")
    reference = convert_bytes(data, options, engine="reference")
    assert native.requests == reference.requests
    assert native.stats == reference.stats
    assert native.ops == reference.ops
    return native


def _reconciles(stats: dict[str, int]) -> None:
    shown = stats["spans"] - stats["synthetic_spans"] - stats["aggregate_spans"] + stats["aggregated_events"]
    assert shown + sum(stats[k] for k in DROP_KEYS) + stats["dropped_outside_step"] == stats["complete_events"]


def _parents(spans: list[DSpan]) -> dict[str, str]:
    """Span name -> its parent's name, or the phase's name when the parent is a live phase."""
    by_id = {s.span_id: s.name for s in spans}
    by_id.update({_h(name)[:8]: name for name in PHASES})
    by_id[_h("step")[:8]] = "train.step"
    return {s.name: by_id.get(s.parent_id, "?") for s in spans}


@pytest.mark.parametrize("match", ["number", "time"])
@pytest.mark.parametrize("detail", ["full", "default"])
def test_the_marker_is_cut_to_its_live_step(detail: Detail, match: LiveMatch) -> None:
    options = ConvertOptions(run_id=RUN, detail=detail, min_duration_ns=0, live_steps=(_live(),), live_match=match)
    result = _both(options)
    spans = decode(result).spans
    [marker] = [s for s in spans if s.name == "ProfilerStep#5"]
    assert (marker.start, marker.end) == (1100 * US, 1900 * US)  # the live step's own interval
    assert marker.attrs["output.value"] == '{"step_ms": 0.800}'
    assert not OUTSIDE & {s.name for s in spans}  # never a span, never aggregated
    assert result.stats["dropped_outside_step"] == 4
    assert "outside the live step" in str(marker.attrs["otelprof.hidden"])
    assert marker.attrs["otelprof.hidden_spans"] == 4
    parents = _parents(spans)
    assert parents["ProfilerStep#5"] == "train.step"
    assert {name: parents[name] for name in UNDER} == UNDER
    assert parents["sub"] == "mse_loss"
    _reconciles(result.stats)


@pytest.mark.parametrize("detail", ["full", "default"])
def test_without_an_interval_nothing_is_cut(detail: Detail) -> None:
    """A live step given without its interval, or on another clock (overlapping no part of the
    marker): the marker keeps its times and every event stays; operators before every phase go
    under the first phase."""
    for live in (_live(0, 0), _live(5000 * US, 6000 * US)):
        options = ConvertOptions(run_id=RUN, detail=detail, min_duration_ns=0, live_steps=(live,))
        result = _both(options)
        spans = decode(result).spans
        [marker] = [s for s in spans if s.name == "ProfilerStep#5"]
        assert (marker.start, marker.end) == (1000 * US, 2000 * US)
        assert result.stats["dropped_outside_step"] == 0
        parents = _parents(spans)
        assert {name: parents[name] for name in UNDER} == UNDER
        assert parents["head"] == "data"  # before every phase: the first to begin after it
        assert parents["head_child"] == "head"
        assert parents["tail"] == "optimizer"  # after every phase: the one that began last
        _reconciles(result.stats)


def test_a_step_without_phases_keeps_its_operators_under_the_marker() -> None:
    result = _both(ConvertOptions(run_id=RUN, detail="full", live_steps=(_live(phases=False),)))
    spans = decode(result).spans
    parents = _parents(spans)
    assert {parents[name] for name in UNDER} == {"ProfilerStep#5"}
    assert result.stats["dropped_outside_step"] == 4  # cut all the same


def test_ties_go_to_the_phase_given_first() -> None:
    """Two phases that begin together before an operator overlapping neither: the first given."""
    first, second = (_h("one")[:8], 1150 * US, 1200 * US), (_h("two")[:8], 1150 * US, 1190 * US)
    live = dataclasses.replace(_live(), phases=(first, second))
    spans = decode(_both(ConvertOptions(run_id=RUN, detail="full", live_steps=(live,)))).spans
    assert {s.name: s.parent_id for s in spans}["linear"] == first[0]


@pytest.mark.native
@pytest.mark.parametrize("fragment", ["h100__gaunernst", "amd_trace__mi250"])
@pytest.mark.parametrize("detail", ["full", "default"])
def test_shared_traces_cut_to_narrower_live_steps(fragment: str, detail: Detail) -> None:
    """Real traces, each marker given a live step on its middle half with four phases on its
    second and fourth eighths: every marker lies in its live step, what lay outside is counted,
    and both engines agree."""
    path: Path = shared_trace(fragment)
    markers: dict[int, tuple[int, int]] = {}
    for s in all_spans_pb(convert_cached(path, "reference", detail="full").requests):
        if s.name.startswith("ProfilerStep#") and not s.parent_span_id:
            markers.setdefault(int(s.name.split("#")[1]), (s.start_time_unix_nano, s.end_time_unix_nano))
    assert markers, path
    live = []
    for number, (start, end) in markers.items():
        cut = [start + (end - start) * q // 8 for q in range(9)]
        phases = tuple((_h(f"{number}|{q}")[:8], cut[q], cut[q + 1]) for q in (2, 3, 4, 5))
        live.append(LiveStep(number, _h(f"t{number}")[:16], _h(f"s{number}")[:8], phases, "", cut[2], cut[6]))
    options = ConvertOptions(detail=detail, world_size=1, live_steps=tuple(live))
    skip_unless_native()
    native = convert(path, engine="native", options=options)
    reference = convert(path, engine="reference", options=options)
    assert native.requests == reference.requests
    assert native.stats == reference.stats and native.ops == reference.ops
    assert native.stats["dropped_outside_step"] > 0
    _reconciles(native.stats)
    spans = all_spans_pb(native.requests)
    for ls in live:
        [marker] = [s for s in spans if s.name == f"ProfilerStep#{ls.number}" and s.parent_span_id == ls.span_id]
        assert ls.start_ns <= marker.start_time_unix_nano <= marker.end_time_unix_nano <= ls.end_ns
