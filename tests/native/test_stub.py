"""``otelprof/_native.pyi`` is hand-written: mypy's stubtest holds it equal to the built module
(every name, signature, property and structseq field), with the allowlist beside this file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from converter_helpers import native_module

ALLOWLIST = Path(__file__).resolve().parent / "stubtest_allowlist.txt"


@pytest.mark.slow  # mypy analyses the stub and its imports (about 40 s on 2 cores)
def test_the_stub_matches_the_built_module() -> None:
    native_module()
    command = [sys.executable, "-m", "mypy.stubtest", "otelprof._native", "--allowlist", str(ALLOWLIST)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
