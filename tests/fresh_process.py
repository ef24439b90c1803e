"""``@in_a_fresh_process``: a test whose subject is process-wide (the resident set's high-water
mark) runs again in a new interpreter, its own pytest session, so what earlier tests left in
this process cannot decide it: a worker that had run other files held about 1.9 GB, and a freed
96 MiB buffer stayed resident in its fragmented heap, in every later step's reading. The outer run passes
when the inner one does and shows its output when it does not."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
_INNER = "OTELPROF_TEST_IN_FRESH_PROCESS"

F = TypeVar("F", bound=Callable[..., Any])


def in_a_fresh_process(test: F) -> F:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get(_INNER) == "1":
            return test(*args, **kwargs)
        nodeid = os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", nodeid],
            cwd=ROOT,
            env={**os.environ, _INNER: "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0 and " passed" in done.stdout, (done.stdout + done.stderr)[-6000:]
        return None

    return run  # type: ignore[return-value]
