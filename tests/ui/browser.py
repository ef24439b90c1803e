"""A real browser for the UI tests: Debian's ``chromium`` driven by playwright's Python API with
``executable_path`` (playwright's own browser download is never used: no ``playwright install``).

Chromium is installed before the tests by ``tests/prereqs.py``; missing, the test is skipped, or
fails in CI."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import prereqs

#: Where a screenshot is copied to stay after the run (else the system temp folder).
SCREENSHOT_DIR_VARIABLE = "OTELPROF_UI_SCREENSHOTS"


def chromium() -> str:
    """The path of Debian's chromium (with fonts-liberation, so span names render as text)."""
    return prereqs.tool("chromium")


def screenshot_dir() -> Path:
    """``$OTELPROF_UI_SCREENSHOTS``, else ``otelprof-ui-screenshots`` in the system's temp folder
    (not under pytest's base temp: pytest deletes all but its last three, so any other pytest run
    on the machine would take the screenshot away)."""
    configured = os.environ.get(SCREENSHOT_DIR_VARIABLE, "").strip()
    folder = Path(configured) if configured else Path(tempfile.gettempdir()) / "otelprof-ui-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
