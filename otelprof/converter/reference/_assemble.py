"""The assembly of ``builder.build``'s spans: self times, memory span events, forward/backward
links, the synthetic roots, every kept event's span, their order, the limits, key_averages rows
and the resource (native: ``build_assemble.cpp``).
"""

from __future__ import annotations

from typing import Any

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
from .._options import SPAN_NAME_LENGTH_LIMIT, ConvertOptions
from . import tree
from ._op_attrs import added_attributes
from ._state import Built, OpRow, _BuildState
from .jsonload import as_double, as_int64, render
from .reader import Event, Trace


def op_self_times(st: _BuildState) -> None:
    """key_averages' tree: self CPU and device time (tree.self_times)."""
    st.times = tree.self_times(st.ev, st.parent)


def memory_span_events(st: _BuildState) -> None:
    """Memory events become span events of the span that holds them; step memory peaks; each
    device's peak over the trace (the first event of the largest total) and the span holding it."""
    level_target, parent_span, owner, probe_owner = st.level_target, st.parent_span, st.owner, st.probe_owner
    events: dict[bytes, list[tuple[int, int, Attrs]]] = {}
    peaks: dict[int, tuple[int, int]] = {}
    device_peaks: dict[str, tuple[bytes, int, str]] = {}  # each device's first event of its largest total
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
        device = dict(mem_attrs).get("otelprof.memory.device")
        if isinstance(device, str) and total is not None and total > device_peaks.get(device, (b"", -(2**64), ""))[1]:
            device_peaks[device] = (target, total, device)
        if not target:
            st.stats["memory_events_dropped"] += 1
            continue
        events.setdefault(target, []).append((mem.ts, mem.ordinal, mem_attrs))
    st.span_events, st.peaks, st.memory_peaks = events, peaks, device_peaks


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
    """What a trace root adds: what its trace folded (hidden_counts), the source file, the
    execution trace file."""
    attrs = list(st.root_attrs.get(span_id, ()))
    if st.opts.source_file is not None:
        attrs.append(("otelprof.source.file", st.opts.source_file))
    if st.opts.execution_trace_file is not None:
        attrs.append(("otelprof.execution_trace.file", st.opts.execution_trace_file))
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
        attrs.extend(added_attributes(st, i, my_id))
        if i in step_num or i == st.window_root_ev:
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
    ``code.*`` attributes (build_assemble.cpp add_code_attributes): split at the first ``"): "``, the
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
