"""Event records -> span tree, links, span events and per-op aggregates.

The pure-Python statement of the span model; ``native/src/builder.cpp`` implements the
same steps in the same order. Every decision here is described in
docs/semantic-conventions.md.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from .._options import SPAN_NAME_LENGTH_LIMIT, ConvertOptions, LiveStep
from .._text import clean
from . import ids, tree
from .jsonload import as_double, as_int64, render
from .reader import Event, Trace
from .schema import (
    ARG_ATTRIBUTES,
    DEVICE_TIME_KINDS,
    DOUBLE,
    INT,
    MEMORY_ATTRIBUTES,
    STRING,
    Kind,
)

_STEP_RE = re.compile(r"ProfilerStep#([0-9]{1,18})\Z")
AttrValue = str | int | float | bool
Attrs = list[tuple[str, AttrValue]]


@dataclass
class Span:
    order: int
    trace_id: bytes
    span_id: bytes
    parent_id: bytes
    name: str
    start: int
    end: int
    attrs: Attrs
    events: list[tuple[int, int, Attrs]] = field(default_factory=list)
    dropped_events: int = 0
    links: list[tuple[bytes, bytes, Attrs]] = field(default_factory=list)
    dropped_links: int = 0


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


def build(trace: Trace, opts: ConvertOptions) -> Built:
    ev = trace.events
    n = len(ev)
    full = opts.full
    stats = dict.fromkeys(STAT_KEYS, 0)
    stats["events_total"] = trace.total
    stats["complete_events"] = n
    stats["metadata_events"] = trace.metadata_events
    stats["ignored_events"] = trace.ignored_events
    stats["memory_events"] = len(trace.memory)
    stats["flow_events"] = len(trace.flows)

    rank = opts.rank if opts.rank is not None else trace.rank
    world = opts.world_size if opts.world_size is not None else trace.world_size
    rank_s = "" if rank is None else str(rank)
    min_start = min((e.start for e in ev), default=0)
    run_id = clean(opts.run_id) if opts.run_id is not None else trace.trace_id
    if run_id is None:
        run_id = f"auto|{trace.trace_name}|{min_start}"
    split = opts.split_world_size > 0 and (world or 1) >= opts.split_world_size
    window = ids.window_id(((e.start, e.end) for e in ev), trace.total)
    base = ids.span_base(run_id, rank_s, window)

    # --- steps -------------------------------------------------------------------------
    step_num: dict[int, int] = {}
    for i, e in enumerate(ev):
        if not e.device and e.name.startswith("ProfilerStep#"):
            m = _STEP_RE.match(e.name)
            if m and int(m.group(1)) not in step_num.values():
                step_num[i] = int(m.group(1))
    steps = sorted(step_num, key=lambda i: (ev[i].start, ev[i].ordinal))
    step_index = {s: k for k, s in enumerate(steps)}
    step_starts = [ev[s].start for s in steps]
    stats["steps"] = len(steps)

    def step_at(t: int) -> int:
        k = bisect_right(step_starts, t) - 1
        return steps[k] if k >= 0 and t < ev[steps[k]].end else -1

    # --- the event tree (tree.py) ---------------------------------------------------------
    fwd_flows = [f for f in trace.flows if f.fwdbwd]
    n_mem = len(trace.memory)
    nesting = tree.nest(ev, trace.memory, fwd_flows)
    parent, children, probe_owner = nesting.parent, nesting.children, nesting.probe_owner
    stats["device_events_unlinked"] = tree.link_device_work(ev, parent)
    owner = tree.owners(ev, parent, step_num, step_at)
    unset = -2

    # --- volume control: which events stay spans ----------------------------------------
    keep = [
        full
        or e.device
        or i in step_num
        or (e.kind != Kind.PYTHON and (e.kind == Kind.TRACE or e.dur >= opts.min_duration_ns))
        for i, e in enumerate(ev)
    ]
    nearest: list[int] = [unset] * n

    def nearest_kept(i: int) -> int:
        chain: list[int] = []
        j = i
        while j >= 0 and nearest[j] == unset and not keep[j]:
            chain.append(j)
            j = parent[j]
        result = -1 if j < 0 else (j if keep[j] else nearest[j])
        if j >= 0:
            nearest[j] = result
        for c in chain:
            nearest[c] = result
        return result

    # --- trace ids, roots ----------------------------------------------------------------
    n_total = trace.total
    step_trace = {s: ids.trace_id(f"step|{run_id}|{step_num[s]}") for s in steps}
    live: dict[int, LiveStep] = {}
    for ls in () if split else opts.live_steps:
        live.setdefault(ls.number, ls)  # the first for a number, as the native core takes
    live_of = {s: live[step_num[s]] for s in steps if step_num[s] in live}
    for s, ls in live_of.items():
        step_trace[s] = ls.trace_id
    detail_trace = {s: ids.trace_id(f"detail|{run_id}|{rank_s}|{step_num[s]}") for s in steps} if split else {}
    window_trace = ids.trace_id(f"window|{run_id}|{rank_s}|{window}")

    def trace_of(i: int) -> bytes:
        o = owner[i]
        if o < 0:
            return window_trace
        return step_trace[o] if (i == o or not split) else detail_trace[o]

    def sid(ordinal: int) -> bytes:
        return ids.span_id(base, ordinal)

    window_members = [i for i in range(n) if keep[i] and owner[i] == -1]
    window_root_ev = min(
        (i for i in window_members if ev[i].kind == Kind.TRACE), default=-1, key=lambda i: ev[i].ordinal
    )
    window_root_id = b""
    synthetic: list[Span] = []
    detail_root_id = {s: sid(n_total + step_index[s]) for s in steps} if split else {}
    if window_members:
        if window_root_ev >= 0:
            window_root_id = sid(ev[window_root_ev].ordinal)
        else:
            ordinal = n_total + len(steps)
            window_root_id = sid(ordinal)
            synthetic.append(
                Span(
                    -1,
                    window_trace,
                    window_root_id,
                    b"",
                    "otelprof.window",
                    min(ev[i].start for i in window_members),
                    max(ev[i].end for i in window_members),
                    [("pytorch.event.category", "otelprof"), ("otelprof.synthetic", True)],
                )
            )

    def level_target(o: int) -> bytes:
        """Span id that takes what belongs to step ``o`` as a whole (or the window if -1)."""
        if o < 0:
            return window_root_id
        return detail_root_id[o] if split else sid(ev[o].ordinal)

    def under_phase(s: int, i: int, end: int) -> bytes:
        """A CPU span [ev[i].start, end) directly under live step ``s``'s ProfilerStep: the phase
        it overlaps most (the first such), else the ProfilerStep."""
        best, most = sid(ev[s].ordinal), 0
        if not ev[i].device:
            for phase_id, start, stop in live_of[s].phases:
                overlap = min(end, stop) - max(ev[i].start, start)
                if overlap > most:
                    best, most = phase_id, overlap
        return best

    def parent_span(k: int) -> bytes:
        """Parent span id of a kept span given its nearest kept ancestor ``k``."""
        if k >= 0 and not (split and k in step_num):
            return sid(ev[k].ordinal)
        return b""

    # --- aggregation of runs of identical tiny siblings (default detail) ------------------
    aggregated = [False] * n
    agg_spans: list[Span] = []
    if not full:
        for p in range(n):
            if not keep[p] or ev[p].device:
                continue
            run: list[int] = []
            for c in children[p] + [-1]:
                cand = c >= 0 and not keep[c] and ev[c].kind != Kind.PYTHON
                if cand and run and ev[c].name == ev[run[0]].name and ev[c].cat == ev[run[0]].cat:
                    run.append(c)
                    continue
                if len(run) >= 2:
                    first = ev[run[0]]
                    for r in run:
                        aggregated[r] = True
                    attrs: Attrs = [("pytorch.event.category", first.cat)]
                    if isinstance(first.tid, int):
                        attrs.append(("thread.id", first.tid))
                    attrs.append(("otelprof.aggregated_count", len(run)))
                    attrs.append(("otelprof.aggregated_duration_ns", sum(ev[r].dur for r in run)))
                    pid_ = level_target(owner[p]) if (split and p in step_num) else sid(ev[p].ordinal)
                    if p in live_of:
                        pid_ = under_phase(p, run[0], max(ev[r].end for r in run))
                    agg_spans.append(
                        Span(
                            first.ordinal,
                            trace_of(run[0]),
                            sid(first.ordinal),
                            pid_,
                            first.name,
                            first.start,
                            max(ev[r].end for r in run),
                            attrs,
                        )
                    )
                    stats["aggregated_events"] += len(run)
                run = [c] if cand else []
        stats["aggregate_spans"] = len(agg_spans)

    dropped_count: dict[bytes, int] = {}
    for i, e in enumerate(ev):
        if keep[i] or aggregated[i]:
            continue
        stats["dropped_python" if e.kind == Kind.PYTHON else "dropped_short"] += 1
        k = nearest_kept(parent[i]) if parent[i] >= 0 else -1
        target = parent_span(k) if k >= 0 else b""
        if not target:
            target = level_target(owner[i])
        if target:
            dropped_count[target] = dropped_count.get(target, 0) + 1

    times = tree.self_times(ev, parent)
    in_a, a_parent, a_children, child_dur, self_dev = (
        times.in_a,
        times.a_parent,
        times.a_children,
        times.child_dur,
        times.self_dev,
    )

    # --- span events (memory) and step peaks --------------------------------------------
    span_events: dict[bytes, list[tuple[int, int, Attrs]]] = {}
    peaks: dict[int, tuple[int, int]] = {}
    for k, mem in enumerate(trace.memory):
        mem_attrs: Attrs = [
            (attr, v) for arg_key, attr in MEMORY_ATTRIBUTES if (v := as_int64(mem.args.get(arg_key))) is not None
        ]
        s = step_at(mem.ts)
        total = as_int64(mem.args.get("Total Allocated"))
        if s >= 0 and total is not None:
            accel = (as_int64(mem.args.get("Device Type")) or 0) != 0
            cpu_peak, acc_peak = peaks.get(s, (-1, -1))
            peaks[s] = (cpu_peak, max(acc_peak, total)) if accel else (max(cpu_peak, total), acc_peak)
        o = probe_owner[k]
        target = b""
        if o >= 0:
            kk = nearest_kept(o)
            target = parent_span(kk) if kk >= 0 else level_target(owner[o])
        if not target:
            target = level_target(s)
        if not target:
            stats["memory_events_dropped"] += 1
            continue
        span_events.setdefault(target, []).append((mem.ts, mem.ordinal, mem_attrs))

    # --- forward -> backward links -------------------------------------------------------
    links: dict[bytes, list[tuple[bytes, bytes]]] = {}
    pairs = tree.fwdbwd_pairs(ev, fwd_flows, nesting, n_mem)
    for fw, bw in pairs:
        fk, bk = nearest_kept(fw), nearest_kept(bw)
        if fk < 0 or bk < 0 or fk == bk:
            stats["links_dropped"] += 1
            continue
        bucket = links.setdefault(sid(ev[bk].ordinal), [])
        link_target = (trace_of(fk), sid(ev[fk].ordinal))
        if link_target in bucket:
            stats["links_dropped"] += 1
            continue
        bucket.append(link_target)

    # --- assemble spans ------------------------------------------------------------------
    for s in steps if split else ():
        synthetic.append(
            Span(
                -1,
                detail_trace[s],
                detail_root_id[s],
                b"",
                ev[s].name,
                ev[s].start,
                ev[s].end,
                _detail_root_attrs(step_num[s], rank),
                links=[(step_trace[s], sid(ev[s].ordinal), [("otelprof.link.kind", "step")])],
            )
        )
    for sp in synthetic:  # "otelprof.synthetic" stays last
        if sp.span_id in dropped_count:
            sp.attrs.insert(len(sp.attrs) - 1, ("otelprof.dropped_spans", dropped_count[sp.span_id]))
    by_order: list[Span] = list(agg_spans)
    for i, e in enumerate(ev):
        if not keep[i]:
            continue
        attrs = [("pytorch.event.category", e.cat)]
        if not e.device and isinstance(e.tid, int):
            attrs.append(("thread.id", e.tid))
        attrs.extend(_arg_attributes(e.args))
        if in_a[i]:
            attrs.append(("pytorch.op.self_cpu_time_ns", e.dur - child_dur[i]))
            attrs.append(("pytorch.op.self_device_time_ns", self_dev[i]))
        if i in step_num:
            attrs.append(("pytorch.step", step_num[i]))
            cpu_peak, acc_peak = peaks.get(i, (-1, -1))
            peak = acc_peak if acc_peak >= 0 else cpu_peak
            if peak >= 0:
                attrs.append(("pytorch.memory.peak_allocated_bytes", peak))
            attrs.extend(step_list_attrs(step_num[i], e.end - e.start))
        my_id = sid(e.ordinal)
        if my_id in dropped_count:
            attrs.append(("otelprof.dropped_spans", dropped_count[my_id]))
        if i in step_num or i == window_root_ev:
            pid_ = live_of[i].span_id if i in live_of else b""
        elif parent[i] >= 0 and (k := nearest_kept(parent[i])) >= 0:
            pid_ = parent_span(k) or level_target(owner[i])
        else:
            pid_ = level_target(owner[i])
        if live_of and owner[i] in live_of and pid_ == sid(ev[owner[i]].ordinal):
            pid_ = under_phase(owner[i], i, e.end)
        span = Span(e.ordinal, trace_of(i), my_id, pid_, e.name, e.start, e.end, attrs)
        span.links = [(t, s_, [("otelprof.link.kind", "fwdbwd")]) for t, s_ in links.get(my_id, [])]
        if split and i in step_num:
            span.links.append((detail_trace[i], detail_root_id[i], [("otelprof.link.kind", "rank_detail")]))
        by_order.append(span)
    by_order.sort(key=lambda sp: sp.order)
    for sp in synthetic + by_order:
        evs = sorted(span_events.get(sp.span_id, []), key=lambda x: (x[0], x[1]))
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
    stats["links"] = sum(1 for sp in synthetic + by_order for link in sp.links if link[2][0][1] == "fwdbwd")

    ordered = _order_by_trace(synthetic, by_order, steps, ev, step_trace, detail_trace, window_trace, split)
    stats["values_truncated"] = _cut_strings(ordered, opts.attribute_value_length_limit)
    stats["spans"] = len(ordered)
    stats["synthetic_spans"] = len(synthetic)
    ops = _aggregate_ops(ev, in_a, a_parent, a_children, child_dur, self_dev, opts.group_by_input_shapes)
    resource, cut = _resource(trace, opts, run_id, rank, world)
    stats["values_truncated"] += cut
    return Built(ordered, ops, resource, stats, window)


def _cut(text: str, limit: int | None) -> str:
    return text if limit is None or len(text) <= limit else text[:limit]


def _cut_strings(spans: list[Span], limit: int | None) -> int:
    """Cut span names and string attribute values longer than their limits (OpenTelemetry's
    attribute value length limit, in characters); returns how many were cut."""
    cut = 0
    for sp in spans:
        if len(sp.name) > SPAN_NAME_LENGTH_LIMIT:
            sp.name = sp.name[:SPAN_NAME_LENGTH_LIMIT]
            cut += 1
        if limit is None:
            continue
        for k, (key, value) in enumerate(sp.attrs):
            if isinstance(value, str) and len(value) > limit:
                sp.attrs[k] = (key, value[:limit])
                cut += 1
    return cut


def millis(ns: int) -> str:
    """Nanoseconds as milliseconds with three decimals by integer arithmetic, truncated, as the
    native core writes them (spans.hpp append_millis)."""
    ns = max(0, ns)
    return f"{ns // 1_000_000}.{ns % 1_000_000 // 1000:03d}"


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
    attrs: Attrs = [("pytorch.event.category", "otelprof"), ("pytorch.step", step)]
    if rank is not None:
        attrs.append(("pytorch.distributed.rank", rank))
    attrs.append(("otelprof.synthetic", True))
    return attrs


STAT_KEYS = (
    "events_total", "complete_events", "metadata_events", "ignored_events", "memory_events", "flow_events",
    "steps", "spans", "synthetic_spans", "aggregate_spans", "aggregated_events", "dropped_python",
    "dropped_short", "memory_events_dropped", "links", "links_dropped", "device_events_unlinked", "requests",
    "values_truncated",
)  # fmt: skip


def _order_by_trace(
    synthetic: list[Span],
    spans: list[Span],
    steps: list[int],
    ev: list[Event],
    step_trace: dict[int, bytes],
    detail_trace: dict[int, bytes],
    window_trace: bytes,
    split: bool,
) -> list[Span]:
    """Traces in step order then the window; in each, the root first then event order."""
    by_trace: dict[bytes, list[Span]] = {}
    for sp in synthetic + spans:
        by_trace.setdefault(sp.trace_id, []).append(sp)
    out: list[Span] = []
    trace_order: list[bytes] = []
    for s in steps:
        trace_order.append(step_trace[s])
        if split:
            trace_order.append(detail_trace[s])
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


def resource_attributes(user: Attrs, scope_version: str | None, computed: Attrs) -> Attrs:
    """A resource: the user's attributes (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``),
    ``service.name`` defaulting to ``unknown_service``, then otelprof's SDK attributes and
    ``computed``, each unless the user set that key."""
    attrs: Attrs = [(clean(k), clean(v) if isinstance(v, str) else v) for k, v in user]
    keys = {k for k, _ in attrs}
    if "service.name" not in keys:
        attrs.insert(0, ("service.name", "unknown_service"))
        keys.add("service.name")
    sdk: Attrs = [("telemetry.sdk.name", "otelprof"), ("telemetry.sdk.language", "python")]
    if scope_version:
        sdk.append(("telemetry.sdk.version", scope_version))
    attrs.extend((k, v) for k, v in [*sdk, *computed] if k not in keys)
    return attrs


def _resource(
    trace: Trace, opts: ConvertOptions, run_id: str, rank: int | None, world: int | None
) -> tuple[Attrs, int]:
    """The resource, and how many of the values it computed were cut (the user's
    ``resource_attributes`` are kept whole, as the OpenTelemetry spec exempts resources)."""
    computed: Attrs = []
    host = trace.host_name or (clean(opts.host_name) if opts.host_name else None)
    if host:
        computed.append(("host.name", host))
    if rank is not None:
        computed.append(("pytorch.distributed.rank", rank))
    if world is not None:
        computed.append(("pytorch.distributed.world_size", world))
    if trace.backend:
        computed.append(("pytorch.distributed.backend", trace.backend))
    if trace.gpu_models:
        computed.append(("hw.gpu.model", trace.gpu_models[0]))
        computed.append(("hw.gpu.count", len(trace.gpu_models)))
    computed.append(("otelprof.run.id", run_id))
    limit, user_keys = opts.resource_value_limit, {clean(k) for k, _ in opts.resource_attributes}
    long = {k for k, v in computed if isinstance(v, str) and len(v) > limit and k not in user_keys}
    computed = [(k, _cut(v, limit) if k in long else v) for k, v in computed]  # type: ignore[arg-type]
    return resource_attributes(list(opts.resource_attributes), opts.scope_version, computed), len(long)
