"""The span-tree shape a trace UI should show, checked on spans read back through a UI's API.

Each backend test (MLflow, Phoenix) turns what its API returns into :class:`ReadSpan` and calls
the checks here, so both UIs are held to one definition:

- **one root per trace**: each step trace (and the window trace) has exactly one span without a
  parent, and every other span's parent was read back in the same trace;
- **kernels under ops**: a kernel (category ``kernel``/``Kernel`` with a correlation id) hangs
  under a CPU op, a span that is not the trace root and not a runtime/driver call (the launch
  between them is fine); directly under the step root (or under a launch that is) only where the
  source trace offers no enclosing op for its launch (``exempt`` correlation ids);
- **fwdbwd links**: every ``otelprof.link.kind = fwdbwd`` link joins a backward op to a forward
  op with the same ``pytorch.op.sequence_number``, both read back, neither a step span (the
  trace root, or ``ProfilerStep#N`` under a live ``train.step``);
- **budget**: spans per trace at most the span budget (``ConvertOptions.span_budget``).

Each check returns a :class:`Report` (what it looked at, what broke, with examples) and
:func:`require` asserts it, so a failure names the numbers.
"""

from __future__ import annotations

import gzip
import json
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
CATEGORY = "pytorch.event.category"
CORRELATION = "pytorch.gpu.correlation_id"
SEQUENCE = "pytorch.op.sequence_number"
LINK_KIND = "otelprof.link.kind"
EXAMPLES = 5


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


def kernels_under_ops(spans: Iterable[ReadSpan], exempt: frozenset[int] = frozenset()) -> Report:
    """Every kernel has, between itself and its trace root, a CPU op (neither the root nor a
    runtime/driver call nor device work). ``exempt``: correlation ids whose launch has no
    enclosing op in the source trace; those may hang under the root (or a launch under it)."""
    report = Report("kernels under CPU ops")
    for trace in by_trace(spans).values():
        for span in trace.values():
            if not is_kernel(span):
                continue
            report.looked_at += 1
            chain = _ancestors(span, trace)
            where = f"{span.name[:48]} (corr {span.attributes.get(CORRELATION)}) in {root_name(trace)}"
            if not chain or chain[-1].parent_id is not None:
                report.problem("kernels whose parent chain was not read back", where)
                continue
            below_root = chain[:-1]
            if any(a.category not in RUNTIME_CATEGORIES and a.category not in DEVICE_CATEGORIES for a in below_root):
                continue
            if int(span.attributes[CORRELATION]) in exempt:
                continue
            parent = chain[0]
            direct = parent is chain[-1]
            kind = "kernels directly under the trace root" if direct else "kernels under a launch under the root"
            report.problem(kind, f"{where}, parent {parent.name}")
    return report


def is_step_span(span: ReadSpan) -> bool:
    """A trace root, or a step's own span below a live ``train.step`` (``ProfilerStep#N``)."""
    return span.parent_id is None or span.name.startswith("ProfilerStep#") or span.name == "train.step"


def _backward(span: ReadSpan) -> bool:
    return "backward" in span.name.lower()


def fwdbwd_links_join_ops(spans: Iterable[ReadSpan]) -> Report:
    """Every fwdbwd link goes from a backward op to a forward op of the same sequence number,
    both ends read back and neither a trace root."""
    report = Report("fwdbwd links join a backward op to its forward op")
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
            if is_step_span(source) or is_step_span(target):
                report.problem("links with a step span (trace root or ProfilerStep#N) at an end", where)
            elif not _backward(source) or _backward(target):
                report.problem("links not from a backward op to a forward op", where)
            elif source.attributes.get(SEQUENCE) is None or source.attributes.get(SEQUENCE) != target.attributes.get(
                SEQUENCE
            ):
                report.problem(
                    "links between different sequence numbers",
                    where + f" ({source.attributes.get(SEQUENCE)} vs {target.attributes.get(SEQUENCE)})",
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
    """One line per trace: root name, span count, kernels, links (for test output)."""
    lines = []
    for trace_id, trace in sorted(by_trace(spans).items(), key=lambda item: root_name(item[1])):
        kernels = sum(is_kernel(s) for s in trace.values())
        links = sum(len(s.links) for s in trace.values())
        lines.append(f"{trace_id[:8]} {root_name(trace)}: {len(trace)} spans, {kernels} kernels, {links} links")
    return "\n".join(lines)
