"""The span-tree shape a trace UI should show, checked on spans read back through a UI's API.

Each backend test (MLflow, Phoenix) turns what its API returns into :class:`ReadSpan` and calls
the checks here, so both UIs are held to one definition:

- **one root per trace**: each step trace (and the window trace) has exactly one span without a
  parent, and every other span's parent was read back in the same trace;
- **kernels under ops or lanes**: a kernel (category ``kernel``/``Kernel`` with a correlation
  id) hangs under a CPU op (the launch between them is fine) or a GPU lane (``gpu D · stream S``,
  synthetic, for device work with no op above it), never directly under its trace root; under a
  launch under the root only where the source trace offers no enclosing op for that launch
  (``exempt`` correlation ids);
- **lanes and device work**: no device span (kernel, memcpy, memset, sync, device annotation)
  hangs directly under a trace root; a lane hangs off its trace's root and holds device work
  only: device spans, or device work folded into it (the span budget may fold all of it);
- **roll-ups intact**: every lane and aggregate span (its members' name and count,
  ``otelprof.aggregated_*``) the converter sent is read back with its name, parent and attributes;
- **fwdbwd links**: every ``otelprof.link.kind = fwdbwd`` link joins a backward op to a forward
  op with the same ``otelprof.op.sequence_number``, both read back, neither a step span (the
  trace root, or ``ProfilerStep#N`` under a live ``train.step``) nor a lane; where an op is no
  span, an end is what stands for it (its aggregate, or the span it was folded into);
- **budget**: spans per trace at most the span budget (``ConvertOptions.span_budget``).

Each check returns a :class:`Report` (what it looked at, what broke, with examples) and
:func:`require` asserts it, so a failure names the numbers.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KERNEL_CATEGORIES = frozenset({"kernel", "Kernel"})
#: CPU-side calls that launch device work: a kernel may hang under one, but it is no op.
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "Runtime", "cuda_driver"})
#: Device-side categories: never an op enclosing a kernel.
DEVICE_CATEGORIES = frozenset(
    {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "cuda_sync", "gpu_user_annotation"}
)
#: Kineto categories of CPU events that can enclose a launch (ops, annotations, Python frames).
ENCLOSING_CATEGORIES = frozenset({"cpu_op", "Operator", "user_annotation", "python_function"})
CATEGORY = "otelprof.event.category"
CORRELATION = "otelprof.gpu.correlation_id"
SEQUENCE = "otelprof.op.sequence_number"
LINK_KIND = "otelprof.link.kind"
SYNTHETIC = "otelprof.synthetic"
AGGREGATED_COUNT = "otelprof.aggregated_count"
HIDDEN_SPANS = "otelprof.hidden_spans"
#: A GPU lane's name (the stream may be a name: ``gpu 0 · stream stream 7`` in 2021 traces).
LANE_NAME = re.compile(r"gpu \S+ · stream \S.*")
#: An aggregate span's name: its members' name, then how many.
AGGREGATE_NAME = re.compile(r"(?P<name>.+) ×(?P<count>[1-9][0-9]*)")
EXAMPLES = 5
#: What a span says of the device work folded into it (``otelprof.folded.<class>.count``).
FOLDED_DEVICE_COUNTS = tuple(f"otelprof.folded.{c}.count" for c in ("kernel", "memcpy", "memset", "device_other"))


@dataclass(frozen=True)
class ReadLink:
    trace_id: str  # hex, no backend prefix
    span_id: str
    attributes: Mapping[str, Any]


@dataclass(frozen=True)
class ReadSpan:
    """One span as a UI's API returned it, ids as lower-case hex without backend prefixes."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    attributes: Mapping[str, Any]
    links: tuple[ReadLink, ...] = ()

    @property
    def category(self) -> Any:
        return self.attributes.get(CATEGORY)


@dataclass
class Report:
    """What one check looked at and what broke (counts, then a few examples)."""

    check: str
    looked_at: int = 0
    problems: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def problem(self, kind: str, example: str) -> None:
        self.problems[kind].append(example)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        if self.ok:
            return f"{self.check}: ok ({self.looked_at} checked)"
        lines = [f"{self.check}: {sum(map(len, self.problems.values()))} of {self.looked_at} checked broke the rule"]
        for kind, examples in sorted(self.problems.items()):
            lines.append(f"  {kind}: {len(examples)}, e.g. " + "; ".join(examples[:EXAMPLES]))
        return "\n".join(lines)


def require(report: Report) -> None:
    assert report.ok, str(report)


def by_trace(spans: Iterable[ReadSpan]) -> dict[str, dict[str, ReadSpan]]:
    traces: dict[str, dict[str, ReadSpan]] = defaultdict(dict)
    for span in spans:
        traces[span.trace_id][span.span_id] = span
    return dict(traces)


def _roots(trace: Mapping[str, ReadSpan]) -> list[ReadSpan]:
    return [s for s in trace.values() if s.parent_id is None]


def root_name(trace: Mapping[str, ReadSpan]) -> str:
    roots = _roots(trace)
    return roots[0].name if len(roots) == 1 else f"<{len(roots)} roots>"


def one_root_per_trace(spans: Iterable[ReadSpan]) -> Report:
    report = Report("one root per trace")
    for trace_id, trace in by_trace(spans).items():
        report.looked_at += 1
        roots = _roots(trace)
        if len(roots) != 1:
            report.problem("traces without exactly one root", f"{trace_id[:8]}: {sorted(r.name for r in roots)}")
        orphans = [s for s in trace.values() if s.parent_id is not None and s.parent_id not in trace]
        if orphans:
            report.problem(
                "traces with spans whose parent was not read back",
                f"{trace_id[:8]} ({root_name(trace)}): {len(orphans)} spans, e.g. {orphans[0].name}",
            )
    return report


def _ancestors(span: ReadSpan, trace: Mapping[str, ReadSpan]) -> list[ReadSpan]:
    chain, seen = [], {span.span_id}
    parent_id = span.parent_id
    while parent_id is not None and parent_id in trace and parent_id not in seen:
        seen.add(parent_id)
        parent = trace[parent_id]
        chain.append(parent)
        parent_id = parent.parent_id
    return chain


def is_kernel(span: ReadSpan) -> bool:
    return span.category in KERNEL_CATEGORIES and span.attributes.get(CORRELATION) is not None


def is_lane(span: ReadSpan) -> bool:
    """A GPU lane: the synthetic ``gpu D · stream S`` span that holds device work with no op above it."""
    return bool(span.attributes.get(SYNTHETIC)) and LANE_NAME.fullmatch(span.name) is not None


def is_aggregate(span: ReadSpan) -> bool:
    """An aggregate span: named for its members and their count N (:data:`AGGREGATE_NAME`), with
    ``otelprof.aggregated_count`` = N."""
    match = AGGREGATE_NAME.fullmatch(span.name)
    return match is not None and span.attributes.get(AGGREGATED_COUNT) == int(match["count"])


def _is_op(span: ReadSpan) -> bool:
    """A span that can enclose a launch: neither a runtime call, nor device work, nor synthetic
    (a lane, or a root the converter made)."""
    return (
        span.category not in RUNTIME_CATEGORIES
        and span.category not in DEVICE_CATEGORIES
        and not span.attributes.get(SYNTHETIC)
    )


def kernels_under_ops(spans: Iterable[ReadSpan], exempt: frozenset[int] = frozenset()) -> Report:
    """Every kernel has, between itself and its trace root, a CPU op or a GPU lane; none hangs
    directly under its root. ``exempt``: correlation ids whose launch has no enclosing op in the
    source trace; those may hang under a launch under the root (nothing else)."""
    report = Report("kernels under CPU ops or GPU lanes")
    for trace in by_trace(spans).values():
        for span in trace.values():
            if not is_kernel(span):
                continue
            report.looked_at += 1
            chain = _ancestors(span, trace)
            where = f"{span.name[:48]} (corr {span.attributes.get(CORRELATION)}) in {root_name(trace)}"
            if not chain or chain[-1].parent_id is not None:
                report.problem("kernels whose parent chain was not read back", where)
            elif len(chain) == 1:
                report.problem("kernels directly under the trace root", where)
            elif any(_is_op(a) or is_lane(a) for a in chain[:-1]):
                continue
            elif int(span.attributes[CORRELATION]) not in exempt:
                report.problem("kernels under no CPU op or lane", f"{where}, parent {chain[0].name}")
    return report


def device_work_and_lanes(spans: Iterable[ReadSpan]) -> Report:
    """No device span directly under a trace root; each lane directly under its trace's root,
    holding device spans only, at least one unless device work was folded into it."""
    report = Report("no device span under a root; lanes under the root, holding device work")
    for trace in by_trace(spans).values():
        children: dict[str, list[ReadSpan]] = defaultdict(list)
        for span in trace.values():
            if span.parent_id is not None:
                children[span.parent_id].append(span)
        for span in trace.values():
            parent = trace.get(span.parent_id) if span.parent_id is not None else None
            under_root = parent is not None and parent.parent_id is None
            where = f"{span.name[:48]} in {root_name(trace)}"
            if span.category in DEVICE_CATEGORIES:
                report.looked_at += 1
                if under_root:
                    report.problem("device spans directly under the trace root", where)
            elif is_lane(span):
                report.looked_at += 1
                held = children[span.span_id]
                folded = sum(int(span.attributes.get(key) or 0) for key in FOLDED_DEVICE_COUNTS)
                if not under_root:
                    report.problem("lanes not directly under the trace root", where)
                if any(c.category not in DEVICE_CATEGORIES for c in held):
                    kinds = sorted({str(c.category) for c in held})
                    report.problem("lanes holding other spans than device work", f"{where}: {kinds}")
                elif not held and not folded:
                    report.problem("lanes holding nothing, nothing folded into them", where)
    return report


def rollups_arrive_intact(read: Iterable[ReadSpan], sent: Iterable[ReadSpan]) -> Report:
    """Every lane and aggregate span sent is read back with its name, parent and every attribute
    it was sent with (value and type)."""
    report = Report("lanes and aggregates read back intact")
    index = {(s.trace_id, s.span_id): s for s in read}
    for span in sent:
        if not (is_lane(span) or is_aggregate(span)):
            continue
        report.looked_at += 1
        got = index.get((span.trace_id, span.span_id))
        if got is None:
            report.problem("not read back", span.name)
            continue
        if (got.name, got.parent_id) != (span.name, span.parent_id):
            report.problem("name or parent changed", f"{span.name} -> {got.name}")
        changed = {
            key: got.attributes.get(key)
            for key, value in span.attributes.items()
            if (type(value), value) != (type(got.attributes.get(key)), got.attributes.get(key))
        }
        if changed:
            report.problem("attributes changed or missing", f"{span.name}: {changed}")
    return report


def is_step_span(span: ReadSpan) -> bool:
    """A trace root, or a step's own span below a live ``train.step`` (``ProfilerStep#N``)."""
    return span.parent_id is None or span.name.startswith("ProfilerStep#") or span.name == "train.step"


def _backward(span: ReadSpan) -> bool:
    """A backward op (or what stands for one) by its name: autograd's ``…Backward…`` nodes and
    its engine's calls (``autograd::engine::evaluate_function: torch::autograd::CppNode<…>`` too)."""
    return "backward" in span.name.lower() or span.name.startswith("autograd::engine::evaluate_function:")


def _stands_in(span: ReadSpan) -> bool:
    """What a link to an op that is no span goes to: its aggregate, or a span ops were folded into."""
    return is_aggregate(span) or int(span.attributes.get(HIDDEN_SPANS) or 0) > 0


def fwdbwd_links_join_ops(spans: Iterable[ReadSpan]) -> Report:
    """Every fwdbwd link goes from a backward op to a forward op of the same sequence number,
    both ends read back, neither a trace root, a step or a lane. Where an end's op is no span
    (default detail aggregates and folds), what stands for it does: an aggregate span, or the
    span the op was folded into (one with ``otelprof.hidden_spans``)."""
    report = Report("fwdbwd links join a backward op to its forward op (or what stands for them)")
    index = {(s.trace_id, s.span_id): s for s in spans}
    for source in index.values():
        for link in source.links:
            if link.attributes.get(LINK_KIND) != "fwdbwd":
                continue
            report.looked_at += 1
            target = index.get((link.trace_id, link.span_id))
            where = f"{source.name[:60]} -> "
            if target is None:
                report.problem("links whose forward end was not read back", where + link.span_id)
                continue
            where += target.name[:60]
            sequences = (source.attributes.get(SEQUENCE), target.attributes.get(SEQUENCE))
            if is_step_span(source) or is_step_span(target) or is_lane(source) or is_lane(target):
                report.problem("links with a step span (trace root or ProfilerStep#N) or a lane at an end", where)
            elif not _backward(source) or _backward(target):
                report.problem("links not from a backward op to a forward op", where)
            elif (sequences[0] is None or sequences[0] != sequences[1]) and not (
                _stands_in(source) or _stands_in(target)
            ):
                report.problem(
                    "links between different sequence numbers, neither end standing in for a folded op",
                    where + f" ({sequences[0]} vs {sequences[1]})",
                )
    return report


def spans_within_budget(spans: Iterable[ReadSpan], budget: int) -> Report:
    report = Report(f"at most {budget} spans per trace")
    for trace_id, trace in by_trace(spans).items():
        report.looked_at += 1
        if len(trace) > budget:
            report.problem("traces over the budget", f"{trace_id[:8]} ({root_name(trace)}): {len(trace)} spans")
    return report


def launches_without_enclosing_op(path: Path) -> frozenset[int]:
    """Correlation ids of the kernels in a Kineto trace whose launch (the runtime event of the
    same correlation id) lies in no CPU op, annotation or Python frame of its thread, the
    profiler step excepted: the trace offers no op for such a kernel to hang under."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        events = json.load(f)["traceEvents"]
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    kernels = {
        e["args"]["correlation"]
        for e in complete
        if e.get("cat") in KERNEL_CATEGORIES and isinstance(e.get("args"), dict) and "correlation" in e["args"]
    }
    enclosing: dict[tuple[Any, Any], list[tuple[float, float]]] = defaultdict(list)
    for e in complete:
        if e.get("cat") in ENCLOSING_CATEGORIES and not str(e.get("name", "")).startswith("ProfilerStep#"):
            start = float(e["ts"])
            enclosing[(e.get("pid"), e.get("tid"))].append((start, start + float(e.get("dur", 0))))
    exempt = set()
    for e in complete:
        args = e.get("args")
        if e.get("cat") not in RUNTIME_CATEGORIES or not isinstance(args, dict):
            continue
        correlation = args.get("correlation")
        if correlation is None or correlation not in kernels:
            continue
        ts = float(e["ts"])
        end = ts + float(e.get("dur", 0))
        if not any(a <= ts and end <= b for a, b in enclosing[(e.get("pid"), e.get("tid"))]):
            exempt.add(int(correlation))
    return frozenset(exempt)


def summary(spans: Iterable[ReadSpan]) -> str:
    """One line per trace: root name, span count, kernels, lanes, aggregates, links (for test output)."""
    lines = []
    for trace_id, trace in sorted(by_trace(spans).items(), key=lambda item: root_name(item[1])):
        kernels = sum(is_kernel(s) for s in trace.values())
        lanes = sum(is_lane(s) for s in trace.values())
        aggregates = sum(is_aggregate(s) for s in trace.values())
        links = sum(len(s.links) for s in trace.values())
        lines.append(
            f"{trace_id[:8]} {root_name(trace)}: {len(trace)} spans, {kernels} kernels, {lanes} lanes, "
            f"{aggregates} aggregates, {links} links"
        )
    return "\n".join(lines)
