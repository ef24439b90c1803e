"""What a person opening a GPU step in a trace UI must find there, found from the page alone: an
op with a kernel under it, a GPU lane (``gpu D · stream S``) holding kernels, and an aggregate
span (its members' name and count, the count after a multiplication sign).

The converter's own output for the step (:func:`expected`, converted in the test) says which
names are ops, kernels, lanes and aggregates and how the tree is shaped; the page is held to it:
every span drawn once under the parent it was sent under (rows read by indentation,
``outline.py``), and each row found is clicked so the UI's details pane shows what makes it what
it is (its category, the lane's device and stream, the aggregate's count). A screenshot is taken
of each."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import outline, trees

#: Bounds each wait on the page: the tree drawn, the details pane showing a clicked span.
WAIT_S = 60.0
#: The tree counts as drawn when its row count held this long.
SETTLED_S = 1.5
OP_CATEGORIES = frozenset({"cpu_op", "Operator"})


@dataclass(frozen=True)
class Expected:
    """The GPU step's trace as the converter sent it."""

    trace_id: str
    spans: Mapping[str, trees.ReadSpan]

    @property
    def root(self) -> trees.ReadSpan:
        (root,) = [s for s in self.spans.values() if s.parent_id is None]
        return root

    def edges(self) -> Counter[tuple[str | None, str]]:
        """(parent name, name) of every span: the tree's shape as names show it."""
        return Counter((self.spans[s.parent_id].name if s.parent_id else None, s.name) for s in self.spans.values())

    def names(self, kind: str) -> frozenset[str]:
        test = {
            "kernel": trees.is_kernel,
            "op": lambda s: s.category in OP_CATEGORIES and not trees.is_aggregate(s),
            "lane": trees.is_lane,
            "aggregate": trees.is_aggregate,
        }[kind]
        return frozenset(s.name for s in self.spans.values() if test(s))

    def op_kernel_pairs(self) -> frozenset[tuple[str, str]]:
        """(op name, kernel name) of every kernel sent right under a CPU op."""
        return frozenset(
            (self.spans[s.parent_id].name, s.name)
            for s in self.spans.values()
            if trees.is_kernel(s) and s.parent_id and self.spans[s.parent_id].name in self.names("op")
        )

    def by_name(self, name: str) -> trees.ReadSpan:
        return next(s for s in self.spans.values() if s.name == name)


def expected(sent: list[trees.ReadSpan]) -> Expected:
    """The step trace (of those sent) holding a lane, an aggregate and a kernel under an op."""
    for trace_id, spans in trees.by_trace(sent).items():
        step = Expected(trace_id, spans)
        if step.names("lane") and step.names("aggregate") and step.op_kernel_pairs():
            return step
    raise AssertionError("no trace sent holds a lane, an aggregate and a kernel under an op:\n" + trees.summary(sent))


@dataclass
class Walk:
    """What the page showed: rows drawn, nodes it showed closed (opened), seconds until the tree
    was drawn, nodes the test closed and opened again, the rows found, the screenshots taken."""

    rows: list[outline.Row]
    expanded: int
    drawn_s: float
    reopened: int = 0
    found: dict[str, str] = field(default_factory=dict)  # what -> the row's name (op: "op > kernel")
    screenshots: list[Path] = field(default_factory=list)


def _settled_rows(page: Any, view: outline.TreeView, root: str) -> list[outline.Row]:
    """Waits for the root's row, then for the row count to hold still."""
    deadline = time.monotonic() + WAIT_S
    count, since = -1, time.monotonic()
    while True:
        rows = outline.read(page, view)
        if len(rows) != count:
            count, since = len(rows), time.monotonic()
        elif rows and rows[0].name == root and time.monotonic() - since >= SETTLED_S:
            return rows
        if time.monotonic() > deadline:
            first = rows[0].name if rows else None
            raise AssertionError(f"{view.ui}: {len(rows)} rows drawn after {WAIT_S:.0f} s, the first {first!r}")
        page.wait_for_timeout(250)


def _shows(page: Any, view: outline.TreeView, row: outline.Row, attributes: Mapping[str, object]) -> None:
    """Clicks the row and waits for the details pane to show each attribute with its value."""
    outline.click(page, view, row)
    patterns = [outline.attribute(k, v) for k, v in attributes.items()]
    deadline = time.monotonic() + WAIT_S
    while True:
        text = page.inner_text("body")
        missing = [p.pattern for p in patterns if not p.search(text)]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{view.ui}: after clicking {row.name!r} the page does not show {missing}")
        page.wait_for_timeout(250)


def _close_and_reopen(page: Any, view: outline.TreeView, rows: list[outline.Row], nodes: list[outline.Row]) -> int:
    """Closes ``nodes`` with their toggles, then opens what the page shows closed, as a person
    would: exactly those nodes reopen and the tree is drawn as before. The toggles clicked."""
    for node in sorted(nodes, key=lambda r: -r.dom_index):  # bottom up: closing one moves no row above it
        outline.toggle(page, view, node)
    closed = outline.redrawn(page, view, lambda n: n < len(rows), f"closing {[n.name for n in nodes]}")
    assert {r.name for r in outline.collapsed(closed)} == {n.name for n in nodes}
    reopened, clicked = outline.expand_all(page, view)
    assert reopened == rows, f"{view.ui}: reopening drew {len(reopened)} rows, not the {len(rows)} drawn before"
    return clicked


def walk(page: Any, view: outline.TreeView, step: Expected, shots: Path, started: float) -> Walk:
    """Reads the opened step's tree off the page (every node opened), holds its shape to what was
    sent, and finds, clicks and screenshots an op with a kernel under it, a lane and an aggregate."""
    root = step.root
    _settled_rows(page, view, root.name)
    drawn_s = time.monotonic() - started
    rows, expanded = outline.expand_all(page, view)
    result = Walk(rows, expanded, drawn_s)
    shown = Counter((rows[r.parent].name if r.parent is not None else None, r.name) for r in rows)
    sent = step.edges()
    assert shown == sent, (
        f"{view.ui} draws {len(rows)} rows for {len(step.spans)} spans sent; (parent, name) drawn but not sent: "
        f"{list((shown - sent).items())[:5]}; sent but not drawn: {list((sent - shown).items())[:5]}"
    )
    assert rows[0].name == root.name and rows[0].parent is None

    # What to find: a kernel right under an op, the lane (under the root, holding kernels only)
    # and an aggregate, by the names the converter gave them.
    pairs = step.op_kernel_pairs()
    kernel = next(r for r in rows if r.parent is not None and (rows[r.parent].name, r.name) in pairs)
    assert kernel.parent is not None
    op = rows[kernel.parent]
    (lane_name,) = step.names("lane")
    lane_index = next(k for k, r in enumerate(rows) if trees.LANE_NAME.fullmatch(r.name))
    lane = rows[lane_index]
    assert lane.name == lane_name and lane.parent == 0, f"{view.ui}: lane row {lane} (root {rows[0].name})"
    held = {rows[k].name for k in outline.children(rows, lane_index)}
    assert held and held <= step.names("kernel"), f"{view.ui}: the lane holds {sorted(held)[:5]}"
    aggregate = next(r for r in rows if trees.AGGREGATE_NAME.fullmatch(r.name) and r.name in step.names("aggregate"))
    count = trees.AGGREGATE_NAME.fullmatch(aggregate.name)
    assert count is not None
    result.reopened = _close_and_reopen(page, view, rows, [op, lane])

    def shoot(what: str) -> None:
        path = shots / f"{view.ui.lower()}-gpu-step-{what}.png"
        page.screenshot(path=str(path))
        result.screenshots.append(path)

    # Each found row clicked: the details pane says what it is (each pane differs from the one before).
    _shows(page, view, op, {trees.CATEGORY: step.by_name(op.name).category})
    _shows(page, view, kernel, {trees.CATEGORY: step.by_name(kernel.name).category})
    result.found["op"] = f"{op.name} > {kernel.name}"
    shoot("op-kernel")
    sent_lane = step.by_name(lane_name)
    keys = (trees.SYNTHETIC, "otelprof.gpu.device", "otelprof.gpu.stream")
    _shows(page, view, lane, {key: sent_lane.attributes[key] for key in keys})
    result.found["lane"] = f"{lane.name} ({len(held)} kernel names under it)"
    shoot("lane")
    _shows(page, view, aggregate, {trees.AGGREGATED_COUNT: int(count["count"])})
    result.found["aggregate"] = aggregate.name
    shoot("aggregate")
    return result
