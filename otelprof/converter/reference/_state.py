"""What the stages of ``builder.build`` share, and what the build returns.

``_BuildState`` is filled in stage by stage (native: ``build_state.hpp``'s BuildState); its
methods are the look-ups more than one stage makes.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from ...otlp import ids
from ...otlp.spans import Attrs, Span
from .._options import ConvertOptions, LiveStep
from . import tree
from .reader import Event, Flow, Trace


@dataclass
class OpRow:
    name: str
    kind: str
    input_shapes: str
    calls: int = 0
    cpu_total_ns: int = 0
    self_cpu_ns: int = 0
    device_total_ns: int = 0
    self_device_ns: int = 0


@dataclass
class Built:
    spans: list[Span]
    ops: list[OpRow]
    resource: Attrs
    stats: dict[str, int]
    window_id: str


_UNSET = -2  # nearest_kept: not looked up yet


class _BuildState:
    """What the stages of ``build`` share (native: build_state.hpp's BuildState), set stage by stage."""

    # trace_identity
    ev: list[Event]
    n: int
    full: bool
    stats: dict[str, int]
    rank: int | None
    world: int | None
    rank_s: str
    run_id: str
    split: bool
    window: str
    base: int
    # event_tree
    step_num: dict[int, int]
    steps: list[int]
    step_index: dict[int, int]
    step_starts: list[int]
    fwd_flows: list[Flow]
    nesting: tree.Nesting
    parent: list[int]
    children: list[list[int]]
    probe_owner: list[int]
    owner: list[int]
    # volume_keep
    keep: list[bool]
    reason: list[int]
    nearest: list[int]
    # window_iterations
    it_base: int
    it_lo: list[int]
    it_hi: list[int]
    it_source: str
    n_iter: int
    # trace_ids_and_roots
    step_trace: dict[int, bytes]
    live_of: dict[int, LiveStep]
    detail_trace: dict[int, bytes]
    window_trace: bytes
    iteration_trace: list[bytes]
    window_root_ev: int
    window_root_id: bytes
    synthetic: list[Span]
    detail_root_id: dict[int, bytes]
    iteration_root_id: list[bytes]
    # gpu_lanes
    lane_of: dict[int, int]
    lanes: list[tuple[int, int, int]]  # (owner, span-id ordinal, first event): device, stream
    # aggregate_sibling_runs / apply_budget
    aggregated: list[bool]
    aggs: list[list[int]]
    # aggregate_spans, hidden_counts, op_self_times, memory_span_events, fwdbwd_links, assemble_event_spans
    agg_spans: list[Span]
    hidden_attrs: dict[bytes, list[tuple[str, int | str]]]
    root_attrs: dict[bytes, Attrs]
    times: tree.SelfTimes
    span_events: dict[bytes, list[tuple[int, int, Attrs]]]
    peaks: dict[int, tuple[int, int]]
    memory_peaks: dict[str, tuple[bytes, int, str]]  # device -> (span holding its peak, bytes, device)
    op_attrs: dict[int, Attrs]  # op_attributes: by event
    links: dict[bytes, list[tuple[bytes, bytes]]]
    by_order: list[Span]

    def __init__(self, trace: Trace, opts: ConvertOptions) -> None:
        self.trace = trace
        self.opts = opts

    def step_at(self, t: int) -> int:
        k = bisect_right(self.step_starts, t) - 1
        return self.steps[k] if k >= 0 and t < self.ev[self.steps[k]].end else -1

    def nearest_kept(self, i: int) -> int:
        nearest, keep, parent = self.nearest, self.keep, self.parent
        chain: list[int] = []
        j = i
        while j >= 0 and nearest[j] == _UNSET and not keep[j]:
            chain.append(j)
            j = parent[j]
        result = -1 if j < 0 else (j if keep[j] else nearest[j])
        if j >= 0:
            nearest[j] = result
        for c in chain:
            nearest[c] = result
        return result

    def forget(self) -> None:
        self.nearest[:] = [_UNSET] * self.n

    def sid(self, ordinal: int) -> bytes:
        return ids.span_id(self.base, ordinal)

    def trace_of(self, i: int) -> bytes:
        o = self.owner[i]
        if o < 0:
            return self.window_trace
        if o >= self.it_base:
            return self.iteration_trace[o - self.it_base]
        return self.step_trace[o] if (i == o or not self.split) else self.detail_trace[o]

    def level_target(self, o: int) -> bytes:
        """Span id that takes what belongs to step ``o`` as a whole (or the window if -1)."""
        if o < 0:
            return self.window_root_id
        if o >= self.it_base:
            return self.iteration_root_id[o - self.it_base]
        return self.detail_root_id[o] if self.split else self.sid(self.ev[o].ordinal)

    def under_phase(self, s: int, i: int, end: int) -> bytes:
        """A CPU span [ev[i].start, end) directly under live step ``s``'s ProfilerStep: the phase
        it overlaps most (the first such); overlapping none (the loss, between the forward and
        the backward), the phase that began last at or before its start (ties: the first), else
        the first to begin after it; the ProfilerStep when the step has no phases."""
        ev = self.ev
        best, most = self.sid(ev[s].ordinal), 0
        if ev[i].device:
            return best
        begin = ev[i].start
        before: tuple[int, bytes] | None = None  # the phase that began last at or before begin
        after: tuple[int, bytes] | None = None  # the first to begin after it
        for phase_id, start, stop in self.live_of[s].phases:
            overlap = min(end, stop) - max(begin, start)
            if overlap > most:
                best, most = phase_id, overlap
            if start <= begin and (before is None or start > before[0]):
                before = (start, phase_id)
            elif start > begin and (after is None or start < after[0]):
                after = (start, phase_id)
        nearest = before or after
        return nearest[1] if most == 0 and nearest is not None else best

    def live_interval(self, s: int) -> tuple[int, int] | None:
        """The [start_ns, end_ns] of step marker ``s``'s live step when it overlaps the marker
        (by more than 0 ns; none given, or on another clock: None)."""
        e, live = self.ev[s], self.live_of.get(s)
        if live is None or min(e.end, live.end_ns) - max(e.start, live.start_ns) <= 0:
            return None
        return live.start_ns, live.end_ns

    def marker_times(self, s: int) -> tuple[int, int]:
        """Step marker ``s``'s span times, cut to its live step's interval: a ProfilerStep never
        outlives its train.step."""
        e, live = self.ev[s], self.live_interval(s)
        return (e.start, e.end) if live is None else (max(e.start, live[0]), min(e.end, live[1]))

    def parent_span(self, k: int) -> bytes:
        """Parent span id of a kept span given its nearest kept ancestor ``k``."""
        if k >= 0 and not (self.split and k in self.step_num):
            return self.sid(self.ev[k].ordinal)
        return b""

    def parent_of(self, i: int) -> bytes:
        """Span id of the parent of a non-root event ``i`` (or of an aggregate led by ``i``)."""
        owner = self.owner
        k = self.nearest_kept(self.parent[i]) if self.parent[i] >= 0 else -1
        if k >= 0 and owner[k] != owner[i]:  # a parent in the window, i in an iteration
            k = -1
        if i in self.lane_of and (k < 0 or k in self.step_num or k == self.window_root_ev):
            return self.sid(self.lanes[self.lane_of[i]][1])  # device work with no op above it
        return self.parent_span(k) or self.level_target(owner[i])

    def finish_span(self, sp: Span) -> None:
        """Attaches the span's memory events (by time), applies the event and link limits, and
        counts its fwdbwd links."""
        stats, opts = self.stats, self.opts
        evs = sorted(self.span_events.get(sp.span_id, []), key=lambda x: (x[0], x[1]))
        event_limit, link_limit = opts.span_event_limit, opts.span_link_limit
        if event_limit and len(evs) > event_limit:
            sp.dropped_events = len(evs) - event_limit
            stats["memory_events_dropped"] += sp.dropped_events
            evs = evs[:event_limit]
        sp.events = evs
        if link_limit and len(sp.links) > link_limit:
            sp.dropped_links = len(sp.links) - link_limit
            stats["links_dropped"] += sp.dropped_links
            sp.links = sp.links[:link_limit]
        stats["links"] += sum(1 for link in sp.links if link[2][0][1] == "fwdbwd")
