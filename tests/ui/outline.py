"""A trace UI's span tree as a person reads it off the page: the rows drawn, in order, each with
the span name it shows and how far it is indented; a row's parent is the nearest row above it
that is indented less. Nodes a UI shows collapsed (a toggle, no deeper row below it) are
expanded by clicking their toggle, as a person would.

Each UI names its rows, names and toggles with its own selectors (:class:`TreeView`); everything
else here reads what the browser laid out, never the UI's API."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Bounds how many rounds of expanding a UI may need (each round opens every collapsed node shown).
EXPAND_ROUNDS = 64
#: Bounds the wait for the rows a click opens or closes to be drawn.
REDRAW_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TreeView:
    """Where one UI draws its span tree: CSS selectors of a row, of the span name within a row
    and of a row's expand/collapse toggle (leaves have none)."""

    ui: str
    row: str
    name: str
    toggle: str


MLFLOW = TreeView(
    "MLflow",
    row='[data-testid^="timeline-tree-node-"]',
    name='[data-testid^="span-title-row-"]',
    toggle='[data-testid^="toggle-span-expanded-"]',
)
PHOENIX = TreeView("Phoenix", row=".span-node-wrap", name=".span-node__heading", toggle=".collapse-toggle-button")


@dataclass(frozen=True)
class Row:
    dom_index: int  # among all the view's row elements, drawn or not (for a locator's nth)
    name: str
    indent: float  # the name's left edge, in CSS pixels
    toggle: bool
    parent: int | None  # the index in the row list of the row it hangs under, by indentation


#: For each row element: its name's first line (MLflow adds badges on lines below), the name's
#: left edge, whether it has a toggle, whether it is drawn at all.
_READ = """([row, name, toggle]) => Array.from(document.querySelectorAll(row)).map(r => {
  const n = r.querySelector(name);
  const box = n ? n.getBoundingClientRect() : null;
  return {
    name: n ? n.innerText.split("\\n")[0].trim() : "",
    indent: box ? box.left : 0,
    toggle: r.querySelector(toggle) !== null,
    drawn: n !== null && n.getClientRects().length > 0 && box.width > 0,
  };
})"""


def read(page: Any, view: TreeView) -> list[Row]:
    """The rows drawn, in page order, each with the row it hangs under by indentation."""
    raw = page.evaluate(_READ, [view.row, view.name, view.toggle])
    rows: list[Row] = []
    stack: list[int] = []  # indexes of the rows still open above, by increasing indentation
    for dom_index, item in enumerate(raw):
        if not item["drawn"]:
            continue
        while stack and rows[stack[-1]].indent >= item["indent"]:
            stack.pop()
        rows.append(Row(dom_index, item["name"], item["indent"], item["toggle"], stack[-1] if stack else None))
        stack.append(len(rows) - 1)
    return rows


def collapsed(rows: list[Row]) -> list[Row]:
    """Rows with a toggle and no deeper row right below: nodes shown closed."""
    return [r for k, r in enumerate(rows) if r.toggle and (k + 1 == len(rows) or rows[k + 1].indent <= r.indent)]


def redrawn(page: Any, view: TreeView, done: Callable[[int], bool], what: str) -> list[Row]:
    """The rows once their count satisfies ``done`` (a click's effect is drawn after the click)."""
    deadline = time.monotonic() + REDRAW_TIMEOUT_S
    while True:
        rows = read(page, view)
        if done(len(rows)):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"{view.ui}: {what}: still {len(rows)} rows after {REDRAW_TIMEOUT_S:.0f} s")
        page.wait_for_timeout(100)


def toggle(page: Any, view: TreeView, row: Row) -> None:
    page.locator(view.row).nth(row.dom_index).locator(view.toggle).first.click()


def expand_all(page: Any, view: TreeView) -> tuple[list[Row], int]:
    """Opens every collapsed node, round by round (a node opened may show closed ones); the rows
    then drawn and how many toggles were clicked."""
    clicked = 0
    rows = read(page, view)
    for _ in range(EXPAND_ROUNDS):
        closed = collapsed(rows)
        if not closed:
            return rows, clicked
        for row in reversed(closed):  # bottom up: opening one moves no row above it
            toggle(page, view, row)
            clicked += 1
        # each node opened shows a row more at least: wait for them (else a node still drawn
        # closed would be clicked closed again)
        rows = redrawn(page, view, (len(rows) + len(closed)).__le__, f"opening {len(closed)} nodes")
    raise AssertionError(f"{view.ui}: nodes still collapsed after {EXPAND_ROUNDS} rounds of expanding")


def children(rows: list[Row], index: int) -> list[int]:
    return [k for k, r in enumerate(rows) if r.parent == index]


def click(page: Any, view: TreeView, row: Row) -> None:
    """Selects a row's span by clicking its name (not the row's middle, where a toggle may be)."""
    name = page.locator(view.row).nth(row.dom_index).locator(view.name).first
    name.scroll_into_view_if_needed()
    name.click()


def attribute(key: str, value: object) -> re.Pattern[str]:
    """An attribute as a details pane shows it: the key, then the value (next cell or line);
    booleans as ``true``/``false``."""
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    return re.compile(rf"(^|\s){re.escape(key)}\s+{re.escape(shown)}(\s|$)")
