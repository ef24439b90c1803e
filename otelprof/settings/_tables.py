"""The variable tables of the docs (``docs/*.md``; README.md too, should it hold one), generated
from the registry.

Each table sits between ``<!-- env-table: GROUP -->`` and ``<!-- /env-table -->`` lines;
:func:`render_tables` rewrites what is between them. Signal-specific variables
(``OTEL_EXPORTER_OTLP_TRACES_*``) are left out: the text says the ``TRACES_`` form wins.
"""

from __future__ import annotations

import re
from pathlib import Path

from ._registry import VARIABLES

_BLOCK = re.compile(r"(<!-- env-table: (\w+) -->\n)(.*?)(<!-- /env-table -->)", re.S)


def documents(root: Path) -> list[Path]:
    """The Markdown files whose tables are checked: README.md and ``docs/*.md`` under ``root``."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _md(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def markdown_table(group: str) -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for var in VARIABLES.values():
        if var.group != group or var.general is not None:
            continue
        default = var.default_text
        shown = _md(default) if var.shown is not None else f"`{default}`" if default != "unset" else "unset"
        rows.append(f"| `{var.name}` | {shown} | {_md(var.summary)} |")
    return "\n".join(rows) + "\n"


def render_tables(document: str) -> str:
    """``document`` with every marked table replaced by the registry's."""

    def table(match: re.Match[str]) -> str:
        return match.group(1) + markdown_table(match.group(2)) + match.group(4)

    return _BLOCK.sub(table, document)
