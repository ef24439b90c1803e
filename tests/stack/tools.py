"""Debian's Prometheus tools for the stack tests (`prometheus`, `promtool`, `amtool`), installed
before the tests by ``tests/prereqs.py``: found on PATH, else a skip, or a failure in CI."""

from __future__ import annotations

import prereqs

in_ci = prereqs.in_ci


def require(tool: str) -> str:
    """The path of ``tool`` (package prometheus or prometheus-alertmanager)."""
    return prereqs.tool(tool)
