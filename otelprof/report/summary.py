"""``key_averages()`` tables: per-op rows from Kineto traces (the converter's aggregates) or
from OTLP requests (the operator spans in a spool), sorted, cut and rendered as torch does.

Percentages follow torch's ``_build_table``: self and total CPU shares are of the summed self
CPU time of all rows; the device share is of the summed self device time of the device rows
(kernels, memcpys, memsets), so that op rows, which also carry their kernels' time, do not
count it twice. A kernel's row is named in the table as its spans are (``fold_kernel_name``:
what tells kernels apart first); rows keep the event's whole name (JSON).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace

from ..converter import ConvertOptions, OpStats, TraceFormatError, convert
from ..otlp.names import fold_kernel_name
from ..otlp.schema import (
    CATEGORY_KIND,
    DEVICE_TIME_KINDS,
    FILTERED_NAMES,
    STEP_PREFIX,
    Kind,
)

#: The attribute each --sort key (``report/sorting.py``) orders by.
_SORT_FIELD = {
    "self_cpu": "self_cpu_ns",
    "cpu_total": "cpu_total_ns",
    "self_device": "self_device_ns",
    "device_total": "device_total_ns",
    "calls": "calls",
}
#: A span: (trace id, span id).
_Key = tuple[bytes, bytes]


@dataclass
class Summary:
    """Rows (one per name, kind and, when grouped, input shapes) and what they were made from."""

    rows: list[OpStats] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    engines: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def add(self, rows: Iterable[OpStats]) -> None:
        merged = {(r.name, r.kind, r.input_shapes): r for r in self.rows}
        for row in rows:
            key = (row.name, row.kind, row.input_shapes)
            old = merged.get(key)
            merged[key] = row if old is None else _sum(old, row)
        self.rows = list(merged.values())

    @property
    def self_cpu_total_ns(self) -> int:
        return sum(r.self_cpu_ns for r in self.rows)

    @property
    def self_device_total_ns(self) -> int:
        return sum(r.self_device_ns for r in self.rows if r.kind == "device")


def _sum(a: OpStats, b: OpStats) -> OpStats:
    return replace(
        a,
        calls=a.calls + b.calls,
        cpu_total_ns=a.cpu_total_ns + b.cpu_total_ns,
        self_cpu_ns=a.self_cpu_ns + b.self_cpu_ns,
        device_total_ns=a.device_total_ns + b.device_total_ns,
        self_device_ns=a.self_device_ns + b.self_device_ns,
    )


# --- from a Kineto trace: the converter's own aggregates ---------------------------------


def add_trace(summary: Summary, path: str, group_by_input_shapes: bool, engine: str = "auto") -> None:
    """Adds a trace's ``ConvertResult.ops`` (computed by the native core when it is built)."""
    result = convert(path, options=ConvertOptions(group_by_input_shapes=group_by_input_shapes), engine=engine)
    summary.add(result.ops)
    summary.sources.append(path)
    summary.engines.add(result.engine)


# --- from OTLP requests: the operator spans otelprof wrote ----------------------------------


@dataclass
class _Span:
    name: str
    kind: Kind
    parent: _Key
    start_ns: int
    end_ns: int
    thread: int | None
    self_cpu_ns: int | None  # None: not in the key_averages tree
    self_device_ns: int
    input_dims: str


def add_requests(summary: Summary, requests: Iterable[tuple[str, bytes]], group_by_input_shapes: bool) -> None:
    """Adds the rows that the profiler spans in ``requests`` ((name, serialized
    ``ExportTraceServiceRequest``) pairs) add up to. Exact for spans converted at ``full``
    detail; at ``default`` detail the events dropped or aggregated as too short are missing
    (counted in a note). Spans that are not profiler events (step spans) are left out."""
    # protobuf's message classes only here: a summary of traces does not decode requests
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans: dict[_Key, _Span] = {}
    alias: dict[_Key, _Key] = {}  # detail root -> its step span
    iteration_roots: set[_Key] = set()
    not_profiler = aggregated = dropped = 0
    for name, data in requests:
        try:
            request = ExportTraceServiceRequest.FromString(data)
        except DecodeError:
            raise TraceFormatError(f"{name}: not an OTLP ExportTraceServiceRequest") from None
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    attrs = {kv.key: kv.value for kv in span.attributes}
                    dropped += attrs["otelprof.hidden_spans"].int_value if "otelprof.hidden_spans" in attrs else 0
                    category = attrs.get("otelprof.event.category")
                    key = (span.trace_id, span.span_id)
                    if category is None:
                        not_profiler += 1
                        continue
                    if "otelprof.aggregated_count" in attrs:
                        aggregated += attrs["otelprof.aggregated_count"].int_value
                        continue
                    if "otelprof.synthetic" in attrs and "otelprof.iteration.number" in attrs:
                        iteration_roots.add(key)
                    if "otelprof.synthetic" in attrs and "otelprof.step.number" in attrs:
                        for link in span.links:
                            kinds = [kv.value.string_value for kv in link.attributes if kv.key == "otelprof.link.kind"]
                            if kinds == ["step"]:
                                alias[key] = (link.trace_id, link.span_id)
                    self_cpu = attrs.get("otelprof.op.self_cpu_time_ns")
                    self_device = attrs.get("otelprof.op.self_device_time_ns")
                    dims = attrs.get("otelprof.op.input_dims")
                    thread = attrs.get("thread.id")
                    # the event's name where the span's differs: a kernel's folded, another's cut
                    whole = attrs.get("otelprof.gpu.kernel_name", attrs.get("otelprof.event.name"))
                    spans[key] = _Span(
                        span.name if whole is None else whole.string_value,
                        CATEGORY_KIND.get(category.string_value, Kind.OTHER),
                        (span.trace_id, span.parent_span_id),
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        None if thread is None else thread.int_value,
                        None if self_cpu is None else self_cpu.int_value,
                        0 if self_device is None else self_device.int_value,
                        dims.string_value if dims is not None and group_by_input_shapes else "",
                    )
        summary.sources.append(name)
    summary.add(_rows_from_spans(spans, alias, iteration_roots))
    summary.engines.add("spans")
    if aggregated or dropped:
        summary.notes.append(
            f"{aggregated + dropped} CPU events were aggregated or dropped as short when converted "
            "(detail 'default') and are not counted; convert at OTELPROF_DETAIL=full for exact figures"
        )
    if not_profiler:
        summary.notes.append(f"{not_profiler} spans that are not profiler events (e.g. step spans) are not counted")


def _rows_from_spans(spans: dict[_Key, _Span], alias: dict[_Key, _Key], iteration_roots: set[_Key]) -> list[OpStats]:
    """The converter's ``_aggregate_ops`` over the span tree: the key_averages tree is the spans
    with a self CPU time (their nearest such ancestor is the parent); a child with its parent's
    name that is the parent's only child merges into it (torch's ``_remove_dup_nodes``)."""
    in_a = {k for k, s in spans.items() if s.self_cpu_ns is not None and s.name not in FILTERED_NAMES}
    orphans: list[_Key] = []  # under an iteration root: their event parent may be in the window

    def a_parent(key: _Key) -> _Key | None:
        thread = spans[key].thread
        p = spans[key].parent
        while p[1]:
            p = alias.get(p, p)
            span = spans.get(p)
            if span is None or span.thread not in (None, thread):
                return None  # nesting is per thread: a step span also parents other threads' ops
            if p in in_a:
                return p
            if p in iteration_roots:
                orphans.append(key)
                return None
            p = span.parent
        return None

    parent = {k: a_parent(k) for k in in_a}
    _enclose_steps(spans, in_a, parent, orphans)
    n_children: dict[_Key, int] = {}
    for p in parent.values():
        if p is not None:
            n_children[p] = n_children.get(p, 0) + 1
    device_total = {k: spans[k].self_device_ns for k in in_a}
    for k in sorted(in_a, key=lambda k: _depth(k, parent), reverse=True):  # children before parents
        p = parent[k]
        if p is not None:
            device_total[p] += device_total[k]

    def merged(k: _Key) -> _Key | None:
        """The parent that ``k`` merges into, if it does."""
        p = parent[k]
        return p if p is not None and n_children[p] == 1 and spans[p].name == spans[k].name else None

    def survivor(k: _Key) -> _Key:
        while (p := merged(k)) is not None:
            k = p
        return k

    rows: dict[tuple[str, str, str], list[int]] = {}
    for k in in_a:
        s = spans[k]
        # self times of a merged child go to its survivor, which has the same name
        host = spans[survivor(k)]
        name = "ProfilerStep*" if host.name.startswith(STEP_PREFIX) else host.name
        kind = "annotation" if host.kind == Kind.ANNOTATION else "op"
        row = rows.setdefault((name, kind, host.input_dims), [0, 0, 0, 0, 0])
        row[2] += s.self_cpu_ns or 0
        row[4] += s.self_device_ns
        if merged(k) is None:
            row[0] += 1
            row[1] += s.end_ns - s.start_ns
            row[3] += device_total[k]
    for s in spans.values():
        if s.kind in DEVICE_TIME_KINDS:
            row = rows.setdefault((s.name, "device", ""), [0, 0, 0, 0, 0])
            row[0] += 1
            row[3] += s.end_ns - s.start_ns
            row[4] += s.end_ns - s.start_ns
    return [OpStats(name, kind, shapes, *values) for (name, kind, shapes), values in rows.items()]


def _enclose_steps(
    spans: dict[_Key, _Span],
    in_a: set[_Key],
    parent: dict[_Key, _Key | None],
    orphans: list[_Key],
) -> None:
    """Step spans are trace roots, but in the event tree they nest in what runs around them on
    their thread (python frames of the training loop, with_stack): the innermost such span. So
    do the spans hanging off an iteration root (``orphans``), in a span of another trace."""
    steps = [k for k in in_a if not spans[k].parent[1] and spans[k].name.startswith(STEP_PREFIX)]
    steps += orphans
    if not steps:
        return
    shortest = min(spans[k].end_ns - spans[k].start_ns for k in steps)
    threads = {spans[k].thread for k in steps}
    # what can enclose a step: long spans on a step's thread (few), not steps themselves
    candidates = [
        k
        for k in in_a
        if spans[k].thread in threads
        and spans[k].end_ns - spans[k].start_ns >= shortest
        and not spans[k].name.startswith(STEP_PREFIX)
    ]
    for key in steps:
        step = spans[key]
        around = [
            k
            for k in candidates
            if spans[k].thread == step.thread
            and spans[k].start_ns <= step.start_ns
            and spans[k].end_ns >= step.end_ns
            and k[0] != key[0]  # not in its own trace (there it would be its parent)
        ]
        if around:
            parent[key] = max(around, key=lambda k: (spans[k].start_ns, -spans[k].end_ns))


def _depth(key: _Key, parent: dict[_Key, _Key | None]) -> int:
    depth = 0
    up = parent[key]
    while up is not None:
        depth, up = depth + 1, parent[up]
    return depth


# --- ordering and output -------------------------------------------------------------------


def ordered(rows: Sequence[OpStats], sort: str) -> list[OpStats]:
    """Largest first (``name``: alphabetical); ties in name order, so the output is stable."""
    if sort == "name":
        return sorted(rows, key=lambda r: (r.name, r.kind, r.input_shapes))
    attr = _SORT_FIELD[sort]
    return sorted(rows, key=lambda r: (-getattr(r, attr), r.name, r.kind, r.input_shapes))


def _share(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def to_json(summary: Summary, rows: Sequence[OpStats]) -> str:
    cpu, device = summary.self_cpu_total_ns, summary.self_device_total_ns
    doc = {
        "sources": summary.sources,
        "engine": "+".join(sorted(summary.engines)),
        "self_cpu_total_ns": cpu,
        "self_device_total_ns": device,
        "rows_total": len(summary.rows),
        "rows": [
            {
                **asdict(r),
                "self_cpu_percent": _share(r.self_cpu_ns, cpu),
                "cpu_total_percent": _share(r.cpu_total_ns, cpu),
                "self_device_percent": _share(r.self_device_ns, device),
            }
            for r in rows
        ],
        "notes": summary.notes,
    }
    return json.dumps(doc, indent=1)


def format_time(ns: float) -> str:
    """torch's ``_format_time``: three decimals of s, ms or us."""
    us = ns / 1000
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "NaN"


#: How Kineto (and the nsys/nvprof importer) names memory operations: the other device rows are kernels.
_MEMORY_PREFIXES = ("Memcpy", "Memset")


def _label(row: OpStats) -> str:
    """A row's name as a trace shows it: a kernel's span name, else the name itself."""
    return (
        fold_kernel_name(row.name) if row.kind == "device" and not row.name.startswith(_MEMORY_PREFIXES) else row.name
    )


def _cell(text: str, suffix: str, width: int) -> str:
    """``text`` and ``suffix`` in a column ``width`` wide: cut before the suffix, ``...`` marking the cut."""
    if len(text) + len(suffix) < width - 3:
        return text + suffix
    return text[: max(width - 3 - len(suffix), 0)] + "..." + suffix


def _name_cells(summary: Summary, rows: Sequence[OpStats], width: int) -> list[str]:
    """The Name cell of each row: its label cut at ``width``, or at the narrowest wider column
    where no two device rows read alike. Kernels whose span names are equal (different event
    names folded alike) are numbered `` (1)``, `` (2)``, … in the order of their event names,
    over all rows, so a row keeps its number whichever rows are shown."""
    folded: dict[str, list[str]] = {}
    for r in summary.rows:
        if r.kind == "device":
            folded.setdefault(_label(r), []).append(r.name)
    labels = [_label(r) for r in rows]
    suffixes = []
    for r, label in zip(rows, labels, strict=True):
        alike = sorted(folded.get(label, [])) if r.kind == "device" else []
        suffixes.append(f" ({alike.index(r.name) + 1})" if len(alike) > 1 else "")
    device = [k for k, r in enumerate(rows) if r.kind == "device"]
    longest = max((len(labels[k]) + len(suffixes[k]) for k in device), default=0)
    while width - 3 <= longest and len({_cell(labels[k], suffixes[k], width) for k in device}) < len(device):
        width += 1
    return [_cell(label, suffix, width) for label, suffix in zip(labels, suffixes, strict=True)]


def to_table(summary: Summary, rows: Sequence[OpStats], name_width: int = 55) -> str:
    """The layout of torch's ``key_averages().table()``; the Name column widens past
    ``name_width`` only where two device rows would read alike."""
    cpu, device = summary.self_cpu_total_ns, summary.self_device_total_ns
    has_device = any(r.self_device_ns or r.device_total_ns for r in summary.rows)
    has_shapes = any(r.input_shapes for r in rows)
    headers = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if has_device:
        headers += ["Self Device", "Self Device %", "Device total", "Device time avg"]
    headers.append("# of Calls")
    table: list[list[str]] = []
    for r, name in zip(rows, _name_cells(summary, rows, name_width), strict=True):
        cells = [
            name,
            _pct(r.self_cpu_ns, cpu),
            format_time(r.self_cpu_ns),
            _pct(r.cpu_total_ns, cpu),
            format_time(r.cpu_total_ns),
            format_time(r.cpu_total_ns / r.calls if r.calls else 0),
        ]
        if has_device:
            cells += [
                format_time(r.self_device_ns),
                _pct(r.self_device_ns, device),
                format_time(r.device_total_ns),
                format_time(r.device_total_ns / r.calls if r.calls else 0),
            ]
        cells.append(str(r.calls))
        if has_shapes:
            cells.append(r.input_shapes)
        table.append(cells)
    if has_shapes:
        headers.append("Input Shapes")
    widths = [max([len(headers[i])] + [len(row[i]) for row in table]) for i in range(len(headers))]
    widths[0] = max(widths[0], 4)

    def line(cells: Sequence[str]) -> str:
        numbers = len(headers) - 1 - has_shapes
        padded = [
            cells[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(cells[1 : 1 + numbers], widths[1 : 1 + numbers], strict=True)),
        ]
        return "  ".join(padded + list(cells[1 + numbers :])).rstrip()

    rule = "  ".join("-" * w for w in widths)
    out = [rule, line(headers), rule, *(line(row) for row in table), rule]
    out.append(f"Self CPU time total: {format_time(cpu)}")
    if has_device:
        out.append(f"Self Device time total: {format_time(device)}")
    if len(rows) < len(summary.rows):
        out.append(f"{len(rows)} of {len(summary.rows)} rows shown")
    return "\n".join(out) + "\n"
