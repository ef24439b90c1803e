"""The README is a front door (title, a paragraph, the two commands, at most 150 lines) and every
relative link of README.md and docs/*.md leads to a file and heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (no links or headings live there)."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets ``-1``, ``-2``... as on GitHub."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", _FENCE.sub("", text), re.M):
        slug = candidate = _slug(heading)
        n = 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def test_slugs_are_github_s() -> None:
    assert _slug("Run ids of imported files (`otelprof/importer/discover.py`)") == (
        "run-ids-of-imported-files-otelprofimporterdiscoverpy"
    )
    assert _slug("The exporter's health") == "the-exporters-health"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text("utf-8")
    assert len(text.splitlines()) <= 150
    title, paragraph, rest = text.split("\n\n", 2)
    assert title == "# otelprof"
    assert paragraph and not paragraph.startswith(("#", "```", "|", "-"))
    block = re.match(r"```sh\n(.*?)\n```\n", rest, re.S)
    assert block, "the two commands follow the title and its paragraph"
    run_demo, run_tests = block.group(1).splitlines()  # exactly two
    # torch pinned first, then the extra that brings numpy (torch warns without it), then the demo
    assert run_demo.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    assert "pip install torch==2.13.0 && pip install -e '.[torch]' && otelprof demo" in run_demo
    assert run_tests.startswith("python3 -m venv .venv && ")
    for section in ("## Install", "## Where to go next"):
        assert f"\n{section}\n" in text
    assert len(re.findall(r"^## Quick start: ", text, re.M)) == 3


def test_every_doc_is_reachable_from_the_readme() -> None:
    readme = _prose((ROOT / "README.md").read_text("utf-8"))
    linked = {(ROOT / target.split("#")[0]).resolve() for target in _LINK.findall(readme)}
    assert set(PAGES[1:]) <= linked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(page.read_text("utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text("utf-8")):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"
