"""Event records -> span tree, links, span events and per-op aggregates.

The pure-Python statement of the span model; ``native/src/builder.cpp`` implements the
same steps in the same order. Every decision here is described in
docs/semantic-conventions.md.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from ...otlp import ids
from ...otlp._text import clean
from ...otlp.names import cut_strings, device_name, fold_kernel_name, hex_address
from ...otlp.resource import ResourceFacts
from ...otlp.schema import (
    ARG_ATTRIBUTES,
    DEVICE_TIME_KINDS,
    DOUBLE,
    INT,
    MEMORY_ATTRIBUTES,
    STRING,
    Kind,
)
from ...otlp.spans import Attrs, AttrValue, Span, millis
from .._options import SPAN_NAME_LENGTH_LIMIT, ConvertOptions, LiveStep
from . import tree, volume
from .jsonload import as_double, as_int64, render
from .reader import Event, Flow, Trace

_STEP_RE = re.compile(r"ProfilerStep#([0-9]{1,18})\Z")
_OPTIMIZER_STEP = ("Optimizer.step#", ".step")  # Optimizer.step#<Name>.step, <Name> not empty


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


def _arg_attributes(args: dict[str, Any]) -> Attrs:
    out: Attrs = []
    done: set[str] = set()
    for key, attr, typ in ARG_ATTRIBUTES:
        if attr in done or key not in args:
            continue
        value = args[key]
        converted: AttrValue | None
        if typ == INT:
            converted = as_int64(value)
        elif typ == DOUBLE:
            converted = as_double(value)
        elif typ == STRING:
            converted = value if isinstance(value, str) and type(value) is str and value else None
        else:
            converted = render(value)
        if converted is None:
            continue
        done.add(attr)
        out.append((attr, converted))
    return out


def _memory_attributes(args: dict[str, Any]) -> Attrs:
    """A memory event's attributes: the table's integers, the device by name
    (``otelprof.memory.device``) before the address, the address in hex."""
    out: Attrs = []
    for arg_key, attr in MEMORY_ATTRIBUTES:
        v = as_int64(args.get(arg_key))
        if attr != "otelprof.memory.addr":
            if v is not None:
                out.append((attr, v))
            continue
        dtype = as_int64(args.get("Device Type"))
        device = device_name(dtype, as_int64(args.get("Device Id"))) if dtype is not None else None
        if device is not None:
            out.append(("otelprof.memory.device", device))
        if v is not None:
            out.append((attr, hex_address(v)))
    return out


_UNSET = -2  # nearest_kept: not looked up yet


class _BuildState:
    """What the stages of ``build`` share (native: builder.cpp's BuildState), set stage by stage."""

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


def build(trace: Trace, opts: ConvertOptions) -> Built:
    """The stages, in order; builder.cpp's build_spans runs the same ones under the same names."""
    st = _BuildState(trace, opts)
    trace_identity(st)
    event_tree(st)
    volume_keep(st)
    window_iterations(st)
    trace_ids_and_roots(st)
    gpu_lanes(st)
    aggregate_sibling_runs(st)
    apply_budget(st)
    window_root_rule(st)
    aggregate_spans(st)
    hidden_counts(st)
    op_self_times(st)
    memory_span_events(st)
    fwdbwd_links(st)
    assemble_synthetic_roots(st)
    assemble_event_spans(st)
    ordered = order_spans(st)
    return finish_build(st, ordered)


def trace_identity(st: _BuildState) -> None:
    """Counters, rank, run id and window id: what every id of the trace derives from."""
    trace, opts = st.trace, st.opts
    ev = st.ev = trace.events
    n = st.n = len(ev)
    st.full = opts.full
    stats = st.stats = dict.fromkeys(STAT_KEYS, 0)
    stats["events_total"] = trace.total
    stats["complete_events"] = n
    stats["metadata_events"] = trace.metadata_events
    stats["ignored_events"] = trace.ignored_events
    stats["memory_events"] = len(trace.memory)
    stats["flow_events"] = len(trace.flows)

    st.rank = opts.rank if opts.rank is not None else trace.rank
    st.world = opts.world_size if opts.world_size is not None else trace.world_size
    st.rank_s = "" if st.rank is None else str(st.rank)
    min_start = min((e.start for e in ev), default=0)
    run_id = clean(opts.run_id) if opts.run_id is not None else trace.trace_id
    if run_id is None:
        run_id = f"auto|{trace.trace_name}|{min_start}"
    st.run_id = run_id
    st.split = opts.split_world_size > 0 and (st.world or 1) >= opts.split_world_size
    st.window = ids.window_id(((e.start, e.end) for e in ev), trace.total)
    st.base = ids.span_base(run_id, st.rank_s, st.window)


def event_tree(st: _BuildState) -> None:
    """Steps, nesting, launches and owners (tree.py): the structure every later stage reads."""
    ev, trace = st.ev, st.trace
    step_num: dict[int, int] = {}
    for i, e in enumerate(ev):
        if not e.device and e.name.startswith("ProfilerStep#"):
            m = _STEP_RE.match(e.name)
            if m and int(m.group(1)) not in step_num.values():
                step_num[i] = int(m.group(1))
    steps = sorted(step_num, key=lambda i: (ev[i].start, ev[i].ordinal))
    st.step_num, st.steps = step_num, steps
    st.step_index = {s: k for k, s in enumerate(steps)}
    st.step_starts = [ev[s].start for s in steps]
    st.stats["steps"] = len(steps)

    st.fwd_flows = [f for f in trace.flows if f.fwdbwd]
    nesting = st.nesting = tree.nest(ev, trace.memory, st.fwd_flows)
    st.parent, st.children, st.probe_owner = nesting.parent, nesting.children, nesting.probe_owner
    st.stats["device_events_unlinked"] = tree.link_device_work(ev, st.parent)
    st.owner = tree.owners(ev, st.parent, step_num, st.step_at)


def volume_keep(st: _BuildState) -> None:
    """Which events stay spans at default detail (volume.py): CPU time or launched device time
    over the threshold, the launcher of a kept kernel; the device copy of a step marker goes."""
    ev, n, parent, step_num = st.ev, st.n, st.parent, st.step_num
    keep = [True] * n if st.full else volume.keep_rule(ev, parent, step_num, st.opts.min_duration_ns)
    reason = [0] * n  # why an event is hidden when that is not its kind or length (volume.HIDDEN_*)
    if not st.full:
        for i, e in enumerate(ev):
            if e.kind == Kind.GPU_ANNOTATION and parent[i] in step_num:
                keep[i] = False
                reason[i] = volume.HIDDEN_STEP_COPY
    st.keep, st.reason = keep, reason
    st.nearest = [_UNSET] * n


def window_iterations(st: _BuildState) -> None:
    """A window without steps is cut into iterations (optimizer steps, else the span budget)."""
    ev, n, parent, keep, steps, opts = st.ev, st.n, st.parent, st.keep, st.steps, st.opts
    # Iteration k's owner code is it_base + k (0-based), the native core's slot of its root.
    it_base = st.it_base = n + len(steps) + 1
    it_lo: list[int] = []
    it_hi: list[int] = []
    it_source = ""
    if not steps and n:
        marked = {
            i
            for i, e in enumerate(ev)
            if not e.device
            and len(e.name) > len(_OPTIMIZER_STEP[0]) + len(_OPTIMIZER_STEP[1])
            and e.name.startswith(_OPTIMIZER_STEP[0])
            and e.name.endswith(_OPTIMIZER_STEP[1])
        }

        def outermost(i: int) -> bool:
            j = parent[i]
            while j >= 0:
                if j in marked:
                    return False
                j = parent[j]
            return True

        marks = sorted((i for i in marked if outermost(i)), key=lambda i: (ev[i].end, ev[i].ordinal))
        chunk_of: dict[int, int] = {}
        budget = opts.trace_span_budget
        if marks:
            it_source = "optimizer_step"
            it_hi = [ev[m].end for m in marks]
            it_lo = [min(e.start for e in ev if not e.device), *it_hi[:-1]]
        elif budget and sum(keep) > budget:
            top = [-1] * n  # top-level ancestor (device work through its launch)
            for i in range(n):
                chain = []
                j = i
                while top[j] < 0:
                    if parent[j] < 0:
                        top[j] = j
                        break
                    chain.append(j)
                    j = parent[j]
                for c in chain:
                    top[c] = top[j]
            size = [0] * n
            for i in range(n):
                size[top[i]] += keep[i]
            tops = sorted(
                (i for i in range(n) if parent[i] < 0 and not ev[i].device and ev[i].kind != Kind.TRACE),
                key=lambda i: (ev[i].start, ev[i].ordinal),
            )
            held = 0
            for i in tops:
                if not it_lo or (held and held + size[i] > budget):
                    it_lo.append(ev[i].start)
                    it_hi.append(ev[i].end)
                    held = 0
                held += size[i]
                chunk_of[i] = len(it_lo) - 1
            it_source = "span_budget" if it_lo else ""

        def own_at(i: int) -> int:
            if it_source == "span_budget":
                return it_base + chunk_of[i] if i in chunk_of else -1
            e = ev[i]
            k = bisect_right(it_hi, e.start)
            if e.kind == Kind.TRACE or e.start < it_lo[0] or k == len(it_hi) or e.end > it_hi[k]:
                return -1
            return it_base + k

        if it_source:
            owner = st.owner = tree.iteration_owners(ev, parent, own_at)
            for i, e in enumerate(ev):
                if owner[i] >= it_base:
                    k = owner[i] - it_base
                    it_lo[k] = min(it_lo[k], e.start)
                    it_hi[k] = max(it_hi[k], e.end)
    st.it_lo, st.it_hi, st.it_source = it_lo, it_hi, it_source
    st.n_iter = len(it_lo)
    st.stats["iterations"] = st.n_iter


def trace_ids_and_roots(st: _BuildState) -> None:
    """Each trace's id (step, detail, live step, window, iteration) and its root span."""
    ev, n, keep, owner, steps, step_num = st.ev, st.n, st.keep, st.owner, st.steps, st.step_num
    run_id, rank_s, window, split, n_iter = st.run_id, st.rank_s, st.window, st.split, st.n_iter
    sid = st.sid
    n_total = st.trace.total
    step_trace = st.step_trace = {s: ids.trace_id(f"step|{run_id}|{step_num[s]}") for s in steps}
    live_steps = () if split else st.opts.live_steps
    if st.opts.live_match == "time":
        st.live_of = _live_by_time(ev, steps, live_steps)
    else:
        live: dict[int, LiveStep] = {}
        for ls in live_steps:
            live.setdefault(ls.number, ls)  # the first for a number, as the native core takes
        st.live_of = {s: live[step_num[s]] for s in steps if step_num[s] in live}
    for s, ls in st.live_of.items():
        step_trace[s] = ls.trace_id
    _outside_live_steps(st)
    st.detail_trace = {s: ids.trace_id(f"detail|{run_id}|{rank_s}|{step_num[s]}") for s in steps} if split else {}
    window_trace = st.window_trace = ids.trace_id(f"window|{run_id}|{rank_s}|{window}")
    iteration_trace = st.iteration_trace = [
        ids.trace_id(f"iteration|{run_id}|{rank_s}|{window}|{k + 1}") for k in range(n_iter)
    ]

    window_members = [i for i in range(n) if keep[i] and owner[i] == -1]
    window_owned = [i for i in range(n) if owner[i] == -1]  # hidden ones fold into the window root
    window_root_ev = st.window_root_ev = min(
        (i for i in window_members if ev[i].kind == Kind.TRACE), default=-1, key=lambda i: ev[i].ordinal
    )
    window_root_id = b""
    synthetic: list[Span] = []
    st.detail_root_id = {s: sid(n_total + st.step_index[s]) for s in steps} if split else {}
    iteration_root_id = st.iteration_root_id = [sid(n_total + len(steps) + 1 + k) for k in range(n_iter)]
    if window_owned or n_iter:  # iteration roots link to the window root
        if window_root_ev >= 0:
            window_root_id = sid(ev[window_root_ev].ordinal)
        else:
            ordinal = n_total + len(steps)
            window_root_id = sid(ordinal)
            spread = window_members or window_owned or range(n)
            synthetic.append(
                Span(
                    -1,
                    window_trace,
                    window_root_id,
                    b"",
                    "otelprof.window",
                    min(ev[i].start for i in spread),
                    max(ev[i].end for i in spread),
                    [("otelprof.event.category", "otelprof"), ("otelprof.synthetic", True)],
                )
            )
    t0 = min((e.start for e in ev), default=0)
    for k in range(n_iter):
        lo, hi = st.it_lo[k], st.it_hi[k]
        if st.it_source == "span_budget":  # a part of the window, not an iteration of the loop
            name = f"window part {k + 1}/{n_iter} ({millis(lo - t0)}\N{EN DASH}{millis(hi - t0)} ms)"
            what: Attrs = [("otelprof.window.part", k + 1), ("otelprof.window.parts", n_iter)]
        else:
            name = f"Iteration#{k + 1}"
            what = [("otelprof.iteration.number", k + 1), ("otelprof.iteration.source", st.it_source)]
        synthetic.append(
            Span(
                -1,
                iteration_trace[k],
                iteration_root_id[k],
                b"",
                name,
                lo,
                hi,
                [("otelprof.event.category", "otelprof"), *what, ("otelprof.synthetic", True)],
                links=[(window_trace, window_root_id, [("otelprof.link.kind", "window")])],
            )
        )
    st.window_root_id, st.synthetic = window_root_id, synthetic


def _outside_live_steps(st: _BuildState) -> None:
    """A CPU-side event of a live step's marker that lies wholly outside the step's own interval
    (what its ProfilerStep range held before the step began or after it ended: otelprof's own
    work at the boundary) is in no recorded step: not a span, counted (dropped_outside_step)."""
    keep, reason, owner = st.keep, st.reason, st.owner
    bounds = {s: live for s in st.live_of if (live := st.live_interval(s)) is not None}
    if not bounds:
        return
    for i, e in enumerate(st.ev):
        live = bounds.get(owner[i])
        if live is not None and owner[i] != i and not e.device and (e.end <= live[0] or e.start >= live[1]):
            keep[i] = False
            reason[i] = volume.HIDDEN_OUTSIDE_STEP


def _live_by_time(ev: list[Event], steps: list[int], live_steps: tuple[LiveStep, ...]) -> dict[int, LiveStep]:
    """``live_match="time"``: the step markers in order of start (ties: trace order), each to
    the unused live step whose [start_ns, end_ns] overlaps its [start, end] most (more than 0;
    ties: the first given); a live step goes to one marker at most."""
    used = [False] * len(live_steps)
    live_of: dict[int, LiveStep] = {}
    for s in steps:
        best, most = -1, 0
        for j, ls in enumerate(live_steps):
            overlap = min(ev[s].end, ls.end_ns) - max(ev[s].start, ls.start_ns)
            if not used[j] and overlap > most:
                best, most = j, overlap
        if best >= 0:
            used[best] = True
            live_of[s] = live_steps[best]
    return live_of


def gpu_lanes(st: _BuildState) -> None:
    """Device work whose launch is not a span (not in the trace, or hidden with no op above it)
    goes under one synthetic lane span per trace, device and stream (``gpu 0 · stream 7``),
    never straight under a root (parent_of). A lane is set aside for every (owner, device,
    stream) of device work but a step's device copy, in order of its first event: lane j's span
    id takes ordinal E + S + 1 + I + j (E events, S steps, I iterations); it is sent when
    anything goes under it (assemble_synthetic_roots)."""
    ev, owner, step_num, parent = st.ev, st.owner, st.step_num, st.parent
    first = st.trace.total + len(st.steps) + 1 + st.n_iter
    index: dict[tuple[int, object, object], int] = {}
    lanes: list[tuple[int, int, int]] = []
    lane_of: dict[int, int] = {}
    for i, e in enumerate(ev):
        if not e.device or (e.kind == Kind.GPU_ANNOTATION and parent[i] in step_num):
            continue
        key = (owner[i], (type(e.pid), e.pid), (type(e.tid), e.tid))
        k = index.setdefault(key, len(lanes))
        if k == len(lanes):
            lanes.append((owner[i], first + k, i))
        lane_of[i] = k
    st.lanes, st.lane_of = lanes, lane_of


def aggregate_sibling_runs(st: _BuildState) -> None:
    """Runs of two or more consecutive hidden siblings with one name and category, in one trace,
    become one aggregate span each (default detail)."""
    ev, n, keep, owner, children, reason = st.ev, st.n, st.keep, st.owner, st.children, st.reason
    aggregated = st.aggregated = [False] * n
    aggs = st.aggs = []  # members of each aggregate span, first member leads
    if st.full:
        return
    for p in range(n):
        if not keep[p] or ev[p].device:
            continue
        run: list[int] = []
        for c in children[p] + [-1]:
            cand = c >= 0 and not keep[c] and ev[c].kind != Kind.PYTHON and reason[c] != volume.HIDDEN_OUTSIDE_STEP
            same = cand and bool(run) and owner[c] == owner[run[0]]  # one trace per run
            if same and ev[c].name == ev[run[0]].name and ev[c].cat == ev[run[0]].cat:
                run.append(c)
                continue
            if len(run) >= 2:
                for r in run:
                    aggregated[r] = True
                aggs.append(run)
            run = [c] if cand else []


def apply_budget(st: _BuildState) -> None:
    """The span budget per trace (volume.Budget): aggregate repeated leaves, then drop the least
    significant spans."""
    budget = st.opts.trace_span_budget
    if not budget:
        return
    ev, n, keep, step_num, window_root_ev, trace_of = st.ev, st.n, st.keep, st.step_num, st.window_root_ev, st.trace_of
    roots: dict[bytes, int] = {}
    for i in range(n):
        if keep[i] and (i in step_num or i == window_root_ev):
            roots[trace_of(i)] = roots.get(trace_of(i), 0) + 1
    for sp in st.synthetic:
        roots[sp.trace_id] = roots.get(sp.trace_id, 0) + 1
    for s in st.steps if st.split else ():
        roots[st.detail_trace[s]] = roots.get(st.detail_trace[s], 0) + 1
    # lanes in use count; a trace that is trimmed keeps room for each of its other lanes too (a
    # launching op the budget drops leaves its device work to a lane)
    used = {st.parent_of(i) for i in st.lane_of}
    spare: dict[bytes, int] = {}
    for _o, ordinal, lead in st.lanes:
        counts = roots if st.sid(ordinal) in used else spare
        counts[trace_of(lead)] = counts.get(trace_of(lead), 0) + 1
    st.forget()
    trim = volume.Budget(ev, keep, st.aggregated, st.aggs, st.reason, budget, volume.significance(ev, st.parent))
    trim.apply(
        roots,
        spare,
        lambda i: i in step_num or i == window_root_ev,
        trace_of,
        st.parent_of,
        lambda i: st.sid(ev[i].ordinal),
        st.forget,
    )
    st.forget()


def window_root_rule(st: _BuildState) -> None:
    """A window trace that would hold its root alone, nothing folded into it, is not sent
    (default detail)."""
    keep, owner, window_root_ev = st.keep, st.owner, st.window_root_ev
    if st.full or st.n_iter or window_root_ev < 0 or not keep[window_root_ev]:
        return
    # anything else of the window, hidden or not, keeps it: a hidden event folds into the root
    if not any(owner[i] == -1 and i != window_root_ev for i in range(st.n)):
        keep[window_root_ev] = False
        st.reason[window_root_ev] = volume.HIDDEN_WINDOW_ROOT
        st.window_root_id = b""
        st.forget()


def aggregate_spans(st: _BuildState) -> None:
    """One span per surviving aggregate, under its leader's parent, named for the name and count, with the
    members' count, total, self (less their CPU-side children), shortest and longest time."""
    ev, owner, sid, parent = st.ev, st.owner, st.sid, st.parent
    agg_spans: list[Span] = []
    children_cpu = [0] * st.n  # CPU-side time of each event's CPU-side children
    if st.aggs:
        for i, e in enumerate(ev):
            if not e.device and parent[i] >= 0:
                children_cpu[parent[i]] += e.dur
    for run in st.aggs:
        if not run:  # dropped by the budget
            continue
        first = ev[run[0]]
        end = max(ev[r].end for r in run)
        durs = [ev[r].dur for r in run]
        attrs: Attrs = [("otelprof.event.category", first.cat)]
        if not first.device and isinstance(first.tid, int):
            attrs.append(("thread.id", first.tid))
        suffix = f" \N{MULTIPLICATION SIGN}{len(run)}"
        name = _shown(first, SPAN_NAME_CHARS - len(suffix))
        if name != first.name:
            attrs.append(_full_name(first))
        attrs.append(("otelprof.aggregated_count", len(run)))
        attrs.append(("otelprof.aggregated_duration_ns", sum(durs)))
        attrs.append(("otelprof.aggregated_self_ns", sum(ev[r].dur - children_cpu[r] for r in run)))
        attrs.append(("otelprof.aggregated_min_ns", min(durs)))
        attrs.append(("otelprof.aggregated_max_ns", max(durs)))
        pid_ = st.parent_of(run[0])
        if owner[run[0]] in st.live_of and pid_ == sid(ev[owner[run[0]]].ordinal):
            pid_ = st.under_phase(owner[run[0]], run[0], end)
        label = name + suffix
        span = Span(first.ordinal, st.trace_of(run[0]), sid(first.ordinal), pid_, label, first.start, end, attrs)
        agg_spans.append(span)
        st.stats["aggregated_events"] += len(run)
    st.stats["aggregate_spans"] = len(agg_spans)
    st.agg_spans = agg_spans


def hidden_counts(st: _BuildState) -> None:
    """What each parent says of the spans hidden under it (volume.hidden_attributes), and what
    each trace's root says its trace folded: hidden and aggregated events, per owner."""
    ev, keep, aggregated, reason, stats, owner = st.ev, st.keep, st.aggregated, st.reason, st.stats, st.owner
    hidden: dict[bytes, list[int]] = {}
    folded: dict[bytes, list[int]] = {}  # the owner's root -> [hidden, aggregated]
    for i, e in enumerate(ev):
        if keep[i]:
            continue
        if aggregated[i]:
            folded.setdefault(st.level_target(owner[i]), [0, 0])[1] += 1
            continue
        why = reason[i] or (volume.HIDDEN_PYTHON if e.kind == Kind.PYTHON else volume.HIDDEN_SHORT)
        stats[volume.HIDDEN_STAT[why]] += 1
        if why == volume.HIDDEN_WINDOW_ROOT:
            continue
        target = st.parent_of(i)
        if target:
            hidden.setdefault(target, []).append(i)
            folded.setdefault(st.level_target(owner[i]), [0, 0])[0] += 1
    opts = st.opts
    st.hidden_attrs = {
        target: volume.hidden_attributes(ev, members, reason, opts.min_duration_ns, opts.trace_span_budget)
        for target, members in hidden.items()
    }
    st.root_attrs = {}
    for root, (n_hidden, n_aggregated) in folded.items():
        attrs = st.root_attrs[root] = []
        if n_hidden:
            attrs.append(("otelprof.trace.hidden_events", n_hidden))
        if n_aggregated:
            attrs.append(("otelprof.trace.aggregated_events", n_aggregated))


def op_self_times(st: _BuildState) -> None:
    """key_averages' tree: self CPU and device time (tree.self_times)."""
    st.times = tree.self_times(st.ev, st.parent)


def memory_span_events(st: _BuildState) -> None:
    """Memory events become span events of the span that holds them; step memory peaks."""
    level_target, parent_span, owner, probe_owner = st.level_target, st.parent_span, st.owner, st.probe_owner
    events: dict[bytes, list[tuple[int, int, Attrs]]] = {}
    peaks: dict[int, tuple[int, int]] = {}
    for k, mem in enumerate(st.trace.memory):
        mem_attrs = _memory_attributes(mem.args)
        s = st.step_at(mem.ts)
        total = as_int64(mem.args.get("Total Allocated"))
        if s >= 0 and total is not None:
            accel = (as_int64(mem.args.get("Device Type")) or 0) != 0
            cpu_peak, acc_peak = peaks.get(s, (-1, -1))
            peaks[s] = (cpu_peak, max(acc_peak, total)) if accel else (max(cpu_peak, total), acc_peak)
        o = probe_owner[k]
        target = b""
        if o >= 0:
            kk = st.nearest_kept(o)
            target = parent_span(kk) if kk >= 0 else level_target(owner[o])
        if not target:
            target = level_target(s)
        if not target:
            st.stats["memory_events_dropped"] += 1
            continue
        events.setdefault(target, []).append((mem.ts, mem.ordinal, mem_attrs))
    st.span_events, st.peaks = events, peaks


def fwdbwd_links(st: _BuildState) -> None:
    """Forward -> backward links: an op that is not a span is stood for by what holds it (its
    aggregate, else the op span it folds into; not a step or window root); a link that would
    join a span to itself goes."""
    ev, keep, sid = st.ev, st.keep, st.sid
    leader = {r: run[0] for run in st.aggs for r in run}

    def held_by(x: int) -> bytes:  # a step, window root or lane stands for no op
        if keep[x]:
            return sid(ev[x].ordinal)
        if x in leader:
            return sid(ev[leader[x]].ordinal)
        k = st.nearest_kept(st.parent[x]) if st.parent[x] >= 0 else -1
        if k < 0 or st.owner[k] != st.owner[x] or k in st.step_num or k == st.window_root_ev:
            return b""
        return sid(ev[k].ordinal)

    links: dict[bytes, list[tuple[bytes, bytes]]] = {}
    pairs = tree.fwdbwd_pairs(ev, st.fwd_flows, st.nesting, len(st.trace.memory))
    for fw, bw in pairs:
        source, target = held_by(bw), held_by(fw)
        if not source or not target or source == target:
            st.stats["links_dropped"] += 1
            continue
        bucket = links.setdefault(source, [])
        link_target = (st.trace_of(fw), target)
        if link_target in bucket:
            st.stats["links_dropped"] += 1
            continue
        bucket.append(link_target)
    st.links = links


def assemble_synthetic_roots(st: _BuildState) -> None:
    """The synthetic spans (the window's root, the iterations', the detail roots, the GPU lanes)
    with their attributes, hidden counts, links, span events and limits."""
    ev, step_num, synthetic, hidden_attrs, sid = st.ev, st.step_num, st.synthetic, st.hidden_attrs, st.sid
    for s in st.steps if st.split else ():
        synthetic.append(
            Span(
                -1,
                st.detail_trace[s],
                st.detail_root_id[s],
                b"",
                ev[s].name,
                ev[s].start,
                ev[s].end,
                _detail_root_attrs(step_num[s], st.rank),
                links=[(st.step_trace[s], sid(ev[s].ordinal), [("otelprof.link.kind", "step")])],
            )
        )
    for sp in synthetic:  # "otelprof.synthetic" stays last
        sp.attrs[len(sp.attrs) - 1 : len(sp.attrs) - 1] = [
            *hidden_attrs.get(sp.span_id, ()),
            *_root_attrs(st, sp.span_id),
        ]
        sp.links.extend((t, s_, [("otelprof.link.kind", "fwdbwd")]) for t, s_ in st.links.get(sp.span_id, []))
        st.finish_span(sp)
    span_of = {sid(ordinal): k for k, (_o, ordinal, _lead) in enumerate(st.lanes)}
    held: dict[int, list[int]] = {}  # lane -> [start, end] of what went under it
    for i, e in enumerate(ev):
        if i in st.lane_of:  # kept, aggregated or folded: all of it under its parent (lane or op)
            k = span_of.get(st.parent_of(i), -1)
            if k >= 0:
                lo_hi = held.setdefault(k, [e.start, e.end])
                lo_hi[0], lo_hi[1] = min(lo_hi[0], e.start), max(lo_hi[1], e.end)
    for k, (o, ordinal, lead) in enumerate(st.lanes):
        if k not in held:
            continue
        e = ev[lead]
        attrs: Attrs = [("otelprof.event.category", "otelprof")]
        if isinstance(e.pid, int):
            attrs.append(("otelprof.gpu.device", e.pid))
        if isinstance(e.tid, int):
            attrs.append(("otelprof.gpu.stream", e.tid))
        lane_id = sid(ordinal)
        attrs.extend(hidden_attrs.get(lane_id, ()))
        attrs.append(("otelprof.synthetic", True))
        stream = e.tid if isinstance(e.tid, str) and e.tid.startswith("stream ") else f"stream {e.tid}"
        name = f"gpu {e.pid} \N{MIDDLE DOT} {stream}"  # (old traces' tid says "stream 7" itself)
        lane = Span(-1, st.trace_of(lead), lane_id, st.level_target(o), name, held[k][0], held[k][1], attrs)
        st.finish_span(lane)
        synthetic.append(lane)


def _root_attrs(st: _BuildState, span_id: bytes) -> Attrs:
    """What a trace root adds: what its trace folded (hidden_counts), the source file."""
    attrs = list(st.root_attrs.get(span_id, ()))
    if st.opts.source_file is not None:
        attrs.append(("otelprof.source.file", st.opts.source_file))
    return attrs


def assemble_event_spans(st: _BuildState) -> None:
    """Every kept event's span: attributes, parent, links, span events and limits; then their
    order by ordinal, aggregates merged in."""
    ev, keep, parent, owner, step_num, live_of = st.ev, st.keep, st.parent, st.owner, st.step_num, st.live_of
    split, hidden_attrs, sid = st.split, st.hidden_attrs, st.sid
    in_a, child_dur, self_dev = st.times.in_a, st.times.child_dur, st.times.self_dev
    by_order: list[Span] = list(st.agg_spans)
    for sp in by_order:
        sp.links = [(t, s_, [("otelprof.link.kind", "fwdbwd")]) for t, s_ in st.links.get(sp.span_id, [])]
        st.finish_span(sp)
    for i, e in enumerate(ev):
        if not keep[i]:
            continue
        attrs: Attrs = [("otelprof.event.category", e.cat)]
        if not e.device and isinstance(e.tid, int):
            attrs.append(("thread.id", e.tid))
        name = _shown(e, SPAN_NAME_CHARS)
        if name != e.name:
            attrs.append(_full_name(e))
        if e.kind == Kind.PYTHON:
            attrs.extend(_code_attributes(e.name))
        attrs.extend(_arg_attributes(e.args))
        if in_a[i]:
            attrs.append(("otelprof.op.self_cpu_time_ns", e.dur - child_dur[i]))
            attrs.append(("otelprof.op.self_device_time_ns", self_dev[i]))
        if i in step_num:
            attrs.extend(_step_attributes(st, i, e))
        my_id = sid(e.ordinal)
        if my_id in hidden_attrs:
            attrs.extend(hidden_attrs[my_id])
        if i in step_num or i == st.window_root_ev:
            attrs.extend(_root_attrs(st, my_id))
            pid_ = live_of[i].span_id if i in live_of else b""
        elif i in st.lane_of:
            pid_ = st.parent_of(i)
        elif parent[i] >= 0 and (k := st.nearest_kept(parent[i])) >= 0 and owner[k] == owner[i]:
            pid_ = st.parent_span(k) or st.level_target(owner[i])
        else:
            pid_ = st.level_target(owner[i])
        if live_of and owner[i] in live_of and pid_ == sid(ev[owner[i]].ordinal):
            pid_ = st.under_phase(owner[i], i, e.end)
        start, end = st.marker_times(i) if i in step_num else (e.start, e.end)
        span = Span(e.ordinal, st.trace_of(i), my_id, pid_, name, start, end, attrs)
        span.links = [(t, s_, [("otelprof.link.kind", "fwdbwd")]) for t, s_ in st.links.get(my_id, [])]
        if split and i in step_num:
            span.links.append((st.detail_trace[i], st.detail_root_id[i], [("otelprof.link.kind", "rank_detail")]))
        st.finish_span(span)
        by_order.append(span)
    by_order.sort(key=lambda sp: sp.order)
    st.by_order = by_order


#: Characters of a span name a trace UI's tree can show (a kernel's is folded to fit: names.py).
SPAN_NAME_CHARS = 128


def _shown(e: Event, limit: int) -> str:
    """An event's span name: a kernel's folded, any name cut to ``limit`` characters (``…``)."""
    name = fold_kernel_name(e.name) if e.kind == Kind.KERNEL else e.name
    return name if len(name) <= limit else name[: limit - 1] + "\N{HORIZONTAL ELLIPSIS}"


def _code_attributes(name: str) -> Attrs:
    """A python_function event's frame, ``path(line): function`` as Kineto names it, as the
    ``code.*`` attributes (builder.cpp add_code_attributes): split at the first ``"): "``, the
    line 1-9 ASCII digits after the last ``(`` before it, path and function non-empty; any
    other name gives none."""
    sep = name.find("): ")
    if sep < 0 or sep + 3 == len(name):
        return []
    open_ = name.rfind("(", 0, sep)
    digits = name[open_ + 1 : sep]
    if open_ <= 0 or not 0 < len(digits) <= 9 or any(not "0" <= c <= "9" for c in digits):
        return []
    return [
        ("code.function.name", name[sep + 3 :]),
        ("code.file.path", name[:open_]),
        ("code.line.number", int(digits)),
    ]


def _full_name(e: Event) -> tuple[str, str]:
    """The whole name of an event whose span name is not it: a kernel's demangled name, any other's."""
    return ("otelprof.gpu.kernel_name" if e.kind == Kind.KERNEL else "otelprof.event.name", e.name)


def _step_attributes(st: _BuildState, i: int, e: Event) -> Attrs:
    """A ProfilerStep span's own attributes: step number, memory peak, what a trace list shows,
    the live window's trigger (native: add_step_attributes)."""
    step = st.step_num[i]
    attrs: Attrs = [("otelprof.step.number", step)]
    cpu_peak, acc_peak = st.peaks.get(i, (-1, -1))
    peak = acc_peak if acc_peak >= 0 else cpu_peak
    if peak >= 0:
        attrs.append(("otelprof.memory.peak_allocated_bytes", peak))
    start, end = st.marker_times(i)
    attrs.extend(step_list_attrs(step, end - start))
    live = st.live_of.get(i)
    if live is not None and live.trigger:
        attrs.append(("otelprof.window.trigger", live.trigger))
    return attrs


def order_spans(st: _BuildState) -> list[Span]:
    """Traces in step order, then iterations, then the window; roots first in each."""
    ordered = _order_by_trace(
        st.synthetic,
        st.by_order,
        st.steps,
        st.ev,
        st.step_trace,
        st.detail_trace,
        st.iteration_trace,
        st.window_trace,
        st.split,
    )
    st.stats["spans"] = len(ordered)
    st.stats["synthetic_spans"] = len(st.synthetic)
    return ordered


def finish_build(st: _BuildState, ordered: list[Span]) -> Built:
    """Length limits, key_averages rows and the resource: what is left once spans are in order."""
    stats, times = st.stats, st.times
    stats["values_truncated"] = cut_strings(ordered, SPAN_NAME_LENGTH_LIMIT, st.opts.attribute_value_length_limit)
    ops = _aggregate_ops(
        st.ev,
        times.in_a,
        times.a_parent,
        times.a_children,
        times.child_dur,
        times.self_dev,
        st.opts.group_by_input_shapes,
    )
    resource, cut = _resource(st.trace, st.opts, st.run_id, st.rank, st.world)
    stats["values_truncated"] += cut
    return Built(ordered, ops, resource, stats, st.window)


def step_list_attrs(step: int, duration_ns: int) -> Attrs:
    """What MLflow's and Phoenix's trace lists show of a ``ProfilerStep#N`` span (OpenInference's
    input and output; MLflow's request and response previews)."""
    return [
        ("input.value", f'{{"step": {step}}}'),
        ("input.mime_type", "application/json"),
        ("output.value", f'{{"step_ms": {millis(duration_ns)}}}'),
        ("output.mime_type", "application/json"),
    ]


def _detail_root_attrs(step: int, rank: int | None) -> Attrs:
    attrs: Attrs = [("otelprof.event.category", "otelprof"), ("otelprof.step.number", step)]
    if rank is not None:
        attrs.append(("otelprof.distributed.rank", rank))
    attrs.append(("otelprof.synthetic", True))
    return attrs


STAT_KEYS = (
    "events_total", "complete_events", "metadata_events", "ignored_events", "memory_events", "flow_events",
    "steps", "iterations", "spans", "synthetic_spans", "aggregate_spans", "aggregated_events", "dropped_python",
    "dropped_short", "memory_events_dropped", "links", "links_dropped", "device_events_unlinked", "requests",
    "values_truncated", "dropped_budget", "dropped_step_copies", "dropped_window_roots", "dropped_outside_step",
)  # fmt: skip


def _order_by_trace(
    synthetic: list[Span],
    spans: list[Span],
    steps: list[int],
    ev: list[Event],
    step_trace: dict[int, bytes],
    detail_trace: dict[int, bytes],
    iteration_trace: list[bytes],
    window_trace: bytes,
    split: bool,
) -> list[Span]:
    """Traces in step order, then iteration order, then the window; in each, the root first
    then event order."""
    by_trace: dict[bytes, list[Span]] = {}
    for sp in synthetic + spans:
        by_trace.setdefault(sp.trace_id, []).append(sp)
    out: list[Span] = []
    trace_order: list[bytes] = []
    for s in steps:
        trace_order.append(step_trace[s])
        if split:
            trace_order.append(detail_trace[s])
    trace_order.extend(iteration_trace)
    trace_order.append(window_trace)
    seen: set[bytes] = set()
    for tid in trace_order:
        if tid in seen:  # live steps nested under one application span share its trace
            continue
        seen.add(tid)
        members = by_trace.get(tid, [])
        roots = [sp for sp in members if not sp.parent_id]
        out.extend(roots)
        out.extend(sp for sp in members if sp.parent_id)
    return out


def _aggregate_ops(
    ev: list[Event],
    in_a: list[bool],
    a_parent: list[int],
    a_children: list[int],
    child_dur: list[int],
    self_dev: list[int],
    by_shapes: bool,
) -> list[OpRow]:
    """``key_averages()``: torch's tree with ``_remove_dup_nodes`` merging applied."""
    n = len(ev)
    merged = [
        in_a[i] and a_parent[i] >= 0 and a_children[a_parent[i]] == 1 and ev[a_parent[i]].name == ev[i].name
        for i in range(n)
    ]
    survivor = list(range(n))
    for i in sorted((i for i in range(n) if merged[i]), key=lambda i: (ev[i].start, -ev[i].end, ev[i].ordinal)):
        survivor[i] = survivor[a_parent[i]]
    self_cpu = [0] * n
    self_device = [0] * n
    device_total = [0] * n
    for i in range(n):
        if in_a[i]:
            self_cpu[survivor[i]] += ev[i].dur - child_dur[i]
            self_device[survivor[i]] += self_dev[i]
    # device totals: subtree sums over the (unmerged) tree, children before parents
    for i in sorted(
        (i for i in range(n) if in_a[i]), key=lambda i: (ev[i].start, -ev[i].end, ev[i].ordinal), reverse=True
    ):
        device_total[i] += self_dev[i]
        if a_parent[i] >= 0:
            device_total[a_parent[i]] += device_total[i]
    rows: dict[tuple[str, str, str], OpRow] = {}
    for i, e in enumerate(ev):
        if in_a[i] and not merged[i]:
            name = "ProfilerStep*" if e.name.startswith("ProfilerStep#") else e.name
            kind = "annotation" if e.kind == Kind.ANNOTATION else "op"
            shapes = ""
            if by_shapes:
                dims = e.args.get("Input Dims", e.args.get("Input dims"))
                shapes = render(dims) if dims is not None else ""
            row = rows.setdefault((name, kind, shapes), OpRow(name, kind, shapes))
            row.calls += 1
            row.cpu_total_ns += e.dur
            row.self_cpu_ns += self_cpu[i]
            row.device_total_ns += device_total[i]
            row.self_device_ns += self_device[i]
        elif e.kind in DEVICE_TIME_KINDS:
            row = rows.setdefault((e.name, "device", ""), OpRow(e.name, "device", ""))
            row.calls += 1
            row.device_total_ns += e.dur
            row.self_device_ns += e.dur
    return list(rows.values())


def _resource(
    trace: Trace, opts: ConvertOptions, run_id: str, rank: int | None, world: int | None
) -> tuple[Attrs, int]:
    """The resource (``otelprof.otlp.resource``'s composer, as the native core calls it), and
    how many of the values it computed were cut."""
    facts = ResourceFacts(
        host_name=trace.host_name,
        rank=rank,
        world_size=world,
        backend=trace.backend,
        gpu_models=trace.gpu_models,
        run_id=run_id,
    )
    return opts.resource(facts)
