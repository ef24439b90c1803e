"""Event records -> span tree, links, span events and per-op aggregates.

The pure-Python statement of the span model; ``native/src/builder.cpp`` implements the
same steps in the same order. Every decision here is described in
docs/semantic-conventions.md. ``build`` runs the stages over a ``_BuildState`` (``_state``):
this module holds the first ones (identity, tree, volume, iterations, trace ids), ``_budget``
the volume control that follows, ``_assemble`` the spans' assembly.
"""

from __future__ import annotations

import re
from bisect import bisect_right

from ...otlp import ids
from ...otlp._text import clean
from ...otlp.schema import Kind
from ...otlp.spans import Attrs, Span, millis
from .._options import ConvertOptions, LiveStep
from . import tree, volume
from ._assemble import (
    assemble_event_spans,
    assemble_synthetic_roots,
    finish_build,
    fwdbwd_links,
    memory_span_events,
    op_self_times,
    order_spans,
)
from ._budget import (
    aggregate_sibling_runs,
    aggregate_spans,
    apply_budget,
    gpu_lanes,
    hidden_counts,
    window_root_rule,
)
from ._op_attrs import op_attributes
from ._state import _UNSET, Built, OpRow, _BuildState
from .reader import Event, Trace

__all__ = ["Built", "OpRow", "build"]

_STEP_RE = re.compile(r"ProfilerStep#([0-9]{1,18})\Z")
_OPTIMIZER_STEP = ("Optimizer.step#", ".step")  # Optimizer.step#<Name>.step, <Name> not empty


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
    op_attributes(st)
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
    # Iteration k's owner code is it_base + k (0-based), the native core's slot of its root.
    st.it_base = st.n + len(st.steps) + 1
    st.it_lo, st.it_hi, st.it_source = [], [], ""
    chunk_of: dict[int, int] = {}
    if not st.steps and st.n:
        st.it_lo, st.it_hi, st.it_source, chunk_of = _iteration_bounds(st)
    if st.it_source:
        _iteration_owners(st, chunk_of)
    st.n_iter = len(st.it_lo)
    st.stats["iterations"] = st.n_iter


def _iteration_bounds(st: _BuildState) -> tuple[list[int], list[int], str, dict[int, int]]:
    """The iterations' first bounds and their source: the outermost optimizer steps' ends, else
    (the window over the span budget) consecutive top-level CPU events in chunks of the budget,
    with each top-level event's chunk."""
    ev, n, parent, keep = st.ev, st.n, st.parent, st.keep
    it_lo: list[int] = []
    it_hi: list[int] = []
    it_source = ""
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
    budget = st.opts.trace_span_budget
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
    return it_lo, it_hi, it_source, chunk_of


def _iteration_owners(st: _BuildState, chunk_of: dict[int, int]) -> None:
    """Each event's iteration (tree.iteration_owners): its top-level event's chunk, else the
    iteration whose bounds hold it; each iteration's bounds then widen to what it holds."""
    ev, it_base, it_lo, it_hi, it_source = st.ev, st.it_base, st.it_lo, st.it_hi, st.it_source

    def own_at(i: int) -> int:
        if it_source == "span_budget":
            return it_base + chunk_of[i] if i in chunk_of else -1
        e = ev[i]
        k = bisect_right(it_hi, e.start)
        if e.kind == Kind.TRACE or e.start < it_lo[0] or k == len(it_hi) or e.end > it_hi[k]:
            return -1
        return it_base + k

    owner = st.owner = tree.iteration_owners(ev, st.parent, own_at)
    for i, e in enumerate(ev):
        if owner[i] >= it_base:
            k = owner[i] - it_base
            it_lo[k] = min(it_lo[k], e.start)
            it_hi[k] = max(it_hi[k], e.end)


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


STAT_KEYS = (
    "events_total", "complete_events", "metadata_events", "ignored_events", "memory_events", "flow_events",
    "steps", "iterations", "spans", "synthetic_spans", "aggregate_spans", "aggregated_events", "dropped_python",
    "dropped_short", "memory_events_dropped", "links", "links_dropped", "device_events_unlinked", "requests",
    "values_truncated", "dropped_budget", "dropped_step_copies", "dropped_window_roots", "dropped_outside_step",
    "op_attributes_joined", "op_attributes_unplaced", "op_attributes_unmatched", "op_attributes_missing",
)  # fmt: skip
