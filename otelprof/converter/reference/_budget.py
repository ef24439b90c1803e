"""The volume control of ``builder.build``: GPU lanes, aggregates of repeated siblings, the
span budget per trace, the window root rule, the aggregate spans and what each parent says of
what it hides (native: ``build_budget.cpp``). The rules are volume.py's.
"""

from __future__ import annotations

from ...otlp.schema import Kind
from ...otlp.spans import Attrs, Span
from . import volume
from ._assemble import SPAN_NAME_CHARS, _full_name, _shown
from ._state import _BuildState


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
