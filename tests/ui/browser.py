"""A real browser for the UI tests: Debian's ``chromium`` driven by playwright's Python API with
``executable_path`` (playwright's own browser download is never used: no ``playwright install``).

In CI (``CI=true``, root, apt-get) chromium is installed with apt-get when missing, as
``tests/stack/tools.py`` does for Prometheus; elsewhere the test is skipped with the reason."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from stack.tools import in_ci, install_in_ci

#: Debian's browser, and a font so span names render as text, not boxes.
PACKAGES = ("chromium", "fonts-liberation")
#: Where a screenshot is copied to stay after the run (else the system temp folder).
SCREENSHOT_DIR_VARIABLE = "OTELPROF_UI_SCREENSHOTS"


def chromium() -> str:
    """The path of Debian's chromium; in CI installed when missing, elsewhere a skip."""
    path = shutil.which("chromium")
    if path:
        return path
    if not in_ci():
        pytest.skip(f"chromium not found: apt-get install {' '.join(PACKAGES)} (CI=true installs it)")
    log = install_in_ci(PACKAGES)
    path = shutil.which("chromium")
    if not path:
        pytest.skip(f"chromium could not be installed with apt-get (not root, no apt-get, or apt failed):\n{log}")
    return path


def screenshot_dir() -> Path:
    """``$OTELPROF_UI_SCREENSHOTS``, else ``otelprof-ui-screenshots`` in the system's temp folder
    (not under pytest's base temp: pytest deletes all but its last three, so any other pytest run
    on the machine would take the screenshot away)."""
    configured = os.environ.get(SCREENSHOT_DIR_VARIABLE, "").strip()
    folder = Path(configured) if configured else Path(tempfile.gettempdir()) / "otelprof-ui-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
