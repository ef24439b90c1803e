"""Volume at default detail: which events stay spans, the span budget per trace, and what a
parent says of the spans hidden under it. ``native/src/volume.cpp`` and ``build_budget.cpp`` run the same rules in the
same order; docs/semantic-conventions.md ("Volume") states them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ...otlp.schema import DEVICE_TIME_KINDS, Kind
from .reader import Event

#: Why an event is not a span, beyond its kind (python functions) or length (short); outside
#: step: a CPU-side event of a live step's marker wholly outside that step's own interval.
HIDDEN_SHORT, HIDDEN_PYTHON, HIDDEN_BUDGET, HIDDEN_STEP_COPY, HIDDEN_WINDOW_ROOT, HIDDEN_OUTSIDE_STEP = 1, 2, 3, 4, 5, 6
HIDDEN_STAT = {
    HIDDEN_SHORT: "dropped_short",
    HIDDEN_PYTHON: "dropped_python",
    HIDDEN_BUDGET: "dropped_budget",
    HIDDEN_STEP_COPY: "dropped_step_copies",
    HIDDEN_WINDOW_ROOT: "dropped_window_roots",
    HIDDEN_OUTSIDE_STEP: "dropped_outside_step",
}
#: Names a hidden-spans summary lists, and the characters kept of each.
HIDDEN_NAMES_SHOWN = 3
HIDDEN_NAME_CHARS = 64
#: What hidden events a parent accounts for, by class (``otelprof.folded.<class>.count`` and
#: ``.duration_ns``): CPU-side ops and annotations, python functions, runtime calls, kernels,
#: memcpys, memsets, other device activity (syncs, device annotations).
FOLD_CLASSES = ("op", "python", "runtime", "kernel", "memcpy", "memset", "device_other")
FOLD_CLASS = {
    Kind.OTHER: 0, Kind.CPU_OP: 0, Kind.ANNOTATION: 0, Kind.TRACE: 0, Kind.PYTHON: 1, Kind.RUNTIME: 2,
    Kind.KERNEL: 3, Kind.MEMCPY: 4, Kind.MEMSET: 5, Kind.SYNC: 6, Kind.GPU_ANNOTATION: 6,
}  # fmt: skip
#: Kinds that never count as the op that launched device work.
_NOT_OPS = frozenset({Kind.RUNTIME, Kind.PYTHON, Kind.TRACE})


def launched_device_time(ev: list[Event], parent: list[int]) -> list[int]:
    """Per CPU-side event, the device time (kernels, memcpys, memsets) launched from its subtree."""
    n = len(ev)
    launched = [0] * n
    for d, e in enumerate(ev):
        if e.kind in DEVICE_TIME_KINDS and parent[d] >= 0:
            launched[parent[d]] += e.dur
    cpu = sorted((i for i in range(n) if not ev[i].device), key=lambda i: (ev[i].start, -ev[i].end, ev[i].ordinal))
    for i in reversed(cpu):  # children before their parents
        if parent[i] >= 0:
            launched[parent[i]] += launched[i]
    return launched


def keep_rule(ev: list[Event], parent: list[int], step_num: dict[int, int], min_ns: int) -> list[bool]:
    """Default detail: device work, steps and the profiler window stay; python functions go; any
    other CPU-side event stays when it ran at least ``min_ns``, or (not a runtime call) when
    the device work it launched did. Then, for each kernel/memcpy/memset whose launch has no
    kept op between it and the trace root, the op that launched it (the innermost enclosing
    event that is no runtime call, python function or window) stays too; where no op encloses
    the launch, the kernel goes to its GPU lane (builder.gpu_lanes)."""
    launched = launched_device_time(ev, parent)
    base = [
        e.device
        or i in step_num
        or (
            e.kind != Kind.PYTHON
            and (e.kind == Kind.TRACE or e.dur >= min_ns or (e.kind != Kind.RUNTIME and launched[i] >= min_ns))
        )
        for i, e in enumerate(ev)
    ]
    keep = list(base)
    for d, e in enumerate(ev):
        if e.kind not in DEVICE_TIME_KINDS or parent[d] < 0:
            continue
        j, op = parent[d], -1
        while j >= 0 and not (base[j] and ev[j].kind != Kind.RUNTIME):
            if op < 0 and ev[j].kind not in _NOT_OPS:
                op = j
            j = parent[j]
        if op >= 0 and (j < 0 or j in step_num or ev[j].kind == Kind.TRACE):
            keep[op] = True
    return keep


def significance(ev: list[Event], parent: list[int]) -> list[int]:
    """What a span is worth under the budget: its duration, or for a CPU-side event the device
    time it launched when that is longer (so a parent is never worth less than its children)."""
    launched = launched_device_time(ev, parent)
    return [e.dur if e.device else max(e.dur, launched[i]) for i, e in enumerate(ev)]


class Budget:
    """At most ``budget`` spans per trace (its roots and GPU lanes in use count; once it is
    trimmed, its ``spare`` lanes too). A trace over it first has the leaf siblings of one
    name and category aggregated (two or more, consecutive or not: one span per name), then
    loses its least significant non-root spans (ties: the deeper, then the later in the
    file) until it fits. Hidden events are marked ``HIDDEN_BUDGET``."""

    def __init__(
        self,
        ev: list[Event],
        keep: list[bool],
        aggregated: list[bool],
        aggs: list[list[int]],
        reason: list[int],
        budget: int,
        worth: list[int],
    ) -> None:
        self.ev, self.keep, self.aggregated, self.aggs = ev, keep, aggregated, aggs
        self.reason, self.budget, self.worth = reason, budget, worth

    def apply(
        self,
        roots: dict[bytes, int],
        spare: dict[bytes, int],
        is_root: Callable[[int], bool],
        trace_of: Callable[[int], bytes],
        parent_of: Callable[[int], bytes],
        span_id: Callable[[int], bytes],
        forget: Callable[[], None],
    ) -> None:
        ev, keep = self.ev, self.keep
        members: dict[bytes, list[int]] = {}
        for i in range(len(ev)):
            if keep[i] and not is_root(i):
                members.setdefault(trace_of(i), []).append(i)
        agg_of: dict[bytes, list[int]] = {}
        for a, run in enumerate(self.aggs):
            agg_of.setdefault(trace_of(run[0]), []).append(a)
        for trace, events in members.items():
            if roots.get(trace, 0) + len(events) + len(agg_of.get(trace, [])) <= self.budget:
                continue
            forget()
            self._aggregate_leaves(events, agg_of.get(trace, []), parent_of, span_id, agg_of, trace)
            forget()
            kept = [i for i in events if keep[i]]
            self._drop(kept, roots.get(trace, 0) + spare.get(trace, 0), agg_of.get(trace, []), parent_of, span_id)

    def _aggregate_leaves(
        self,
        events: list[int],
        trace_aggs: list[int],
        parent_of: Callable[[int], bytes],
        span_id: Callable[[int], bytes],
        agg_of: dict[bytes, list[int]],
        trace: bytes,
    ) -> None:
        ev = self.ev
        parents = {i: parent_of(i) for i in events}
        has_child = set(parents.values()) | {parent_of(self.aggs[a][0]) for a in trace_aggs}
        groups: dict[bytes, list[int]] = {}
        for i in events:
            groups.setdefault(parents[i], []).append(i)
        for group in groups.values():
            group.sort(key=lambda i: (ev[i].start, ev[i].ordinal))
            repeats: dict[tuple[str, str], list[int]] = {}  # leaves of one name and category
            for c in group:
                if span_id(c) not in has_child:
                    repeats.setdefault((ev[c].name, ev[c].cat), []).append(c)
            for run in repeats.values():
                if len(run) >= 2:
                    for r in run:
                        self.keep[r] = False
                        self.aggregated[r] = True
                    self.aggs.append(run)
                    agg_of.setdefault(trace, []).append(len(self.aggs) - 1)

    def _drop(
        self,
        events: list[int],
        n_roots: int,
        trace_aggs: list[int],
        parent_of: Callable[[int], bytes],
        span_id: Callable[[int], bytes],
    ) -> None:
        ev, keep = self.ev, self.keep
        live_aggs = [a for a in trace_aggs if self.aggs[a]]
        excess = n_roots + len(events) + len(live_aggs) - self.budget
        if excess <= 0:
            return
        by_id = {span_id(i): i for i in events}
        depth: dict[int, int] = {}

        def depth_of(i: int) -> int:
            chain: list[int] = []
            j: int | None = i
            while j is not None and j not in depth:
                chain.append(j)
                j = by_id.get(parent_of(j))
            d = 0 if j is None else depth[j]
            for c in reversed(chain):
                d += 1
                depth[c] = d
            return depth[i]

        # (worth, -depth, -order, event or -1 - aggregate)
        cands = [(self.worth[i], -depth_of(i), -ev[i].ordinal, i) for i in events]
        for a in live_aggs:
            run = self.aggs[a]
            p = by_id.get(parent_of(run[0]))
            d = 1 + (0 if p is None else depth_of(p))
            cands.append((sum(ev[r].dur for r in run), -d, -ev[run[0]].ordinal, -1 - a))
        cands.sort()
        for _, _, _, c in cands[:excess]:
            if c >= 0:
                keep[c] = False
                self.reason[c] = HIDDEN_BUDGET
            else:
                for r in self.aggs[-1 - c]:
                    self.aggregated[r] = False
                    self.reason[r] = HIDDEN_BUDGET
                self.aggs[-1 - c] = []


def hidden_attributes(
    ev: list[Event], members: list[int], reason: list[int], min_ns: int, budget: int
) -> list[tuple[str, int | str]]:
    """``otelprof.hidden_spans`` and the sentence ``otelprof.hidden`` a parent carries for the
    events hidden under it: how many, why, and the most frequent names."""
    why = {reason[i] or (HIDDEN_PYTHON if ev[i].kind == Kind.PYTHON else HIDDEN_SHORT) for i in members}
    texts = []
    if HIDDEN_SHORT in why:
        texts.append(f"shorter than {min_ns // 1000} µs" if min_ns % 1000 == 0 else f"shorter than {min_ns} ns")
    if HIDDEN_PYTHON in why:
        texts.append("python functions")
    if HIDDEN_BUDGET in why:
        texts.append(f"over the {budget}-span budget")
    if HIDDEN_STEP_COPY in why:
        texts.append("device copy of the step")
    if HIDDEN_OUTSIDE_STEP in why:
        texts.append("outside the live step")
    counts = Counter(ev[i].name for i in members)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:HIDDEN_NAMES_SHOWN]
    shown = ", ".join(f"{name[:HIDDEN_NAME_CHARS]} \N{MULTIPLICATION SIGN}{c}" for name, c in top)
    rest = len(members) - sum(c for _, c in top)
    text = f"{len(members)} hidden ({', '.join(texts)}): {shown}" + (f" and {rest} more" if rest else "")
    out: list[tuple[str, int | str]] = [("otelprof.hidden_spans", len(members)), ("otelprof.hidden", text)]
    by_class = [[0, 0] for _ in FOLD_CLASSES]
    for i in members:
        held = by_class[FOLD_CLASS[ev[i].kind]]
        held[0] += 1
        held[1] += ev[i].dur
    for name, (count, total) in zip(FOLD_CLASSES, by_class, strict=True):
        if count:
            out.append((f"otelprof.folded.{name}.count", count))
            out.append((f"otelprof.folded.{name}.duration_ns", total))
    return out
