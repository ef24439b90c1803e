"""The tests' prerequisites (tests/prereqs.py): a missing one fails in CI and skips elsewhere, and
no test installs software (only prereqs.py, run by the README's test command, does)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import prereqs
import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
def test_a_missing_tool_fails_in_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert prereqs.in_ci()
    with pytest.raises(pytest.fail.Exception, match=r"no-such-tool-here is missing; `python tests/prereqs\.py`"):
        prereqs.tool("no-such-tool-here")


@pytest.mark.parametrize("value", ["", "false", "0"])
def test_a_missing_tool_skips_elsewhere(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert not prereqs.in_ci()
    with pytest.raises(pytest.skip.Exception, match=r"python tests/prereqs\.py"):
        prereqs.header("/no/such/header.h")


_IMPORTS_MISSING = """
import pytest

pytest.importorskip("otelprof_no_such_module")


def test_never_runs() -> None:
    pass
"""
_IMPORTS_MISSING_IN_A_TEST = """
import pytest


def test_needs_a_module() -> None:
    pytest.importorskip("otelprof_no_such_module", reason="the test extra brings it")
"""


@pytest.mark.parametrize("source", [_IMPORTS_MISSING, _IMPORTS_MISSING_IN_A_TEST], ids=["module", "test"])
@pytest.mark.parametrize("ci", ["true", ""])
def test_importorskip_fails_in_ci(source: str, ci: str, tmp_path: Path) -> None:
    """tests/conftest.py takes prereqs' hook: a Python package missing in CI fails the run."""
    (tmp_path / "test_missing.py").write_text(source)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(TESTS)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "prereqs", "-p", "no:cacheprovider", "test_missing.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if ci:
        # 1: the test failed; 2: the module's collection error interrupted the run
        assert run.returncode in (1, 2) and "a prerequisite is missing in CI" in run.stdout, run.stdout
        assert "otelprof_no_such_module" in run.stdout or "the test extra brings it" in run.stdout
    else:
        # 5: nothing left to run once the module skipped
        assert run.returncode in (0, 5) and "1 skipped" in run.stdout, run.stdout


def test_a_present_tool_is_found() -> None:
    assert prereqs.tool("sh").endswith("/sh")


#: how a test would install software: apt, pip or a venv of its own
INSTALLS = re.compile(
    r"""["'](apt-get|apt|dpkg)["']|["']pip["'],\s*["']install["']|"-m",\s*"(pip|venv)"|policy-rc\.d"""
)


def test_no_test_installs_software() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name not in ("prereqs.py", "test_prereqs.py")
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if INSTALLS.search(line)
    ]
    assert not offenders, "install in tests/prereqs.py instead:\n" + "\n".join(offenders)


def test_the_readme_test_command_installs_the_prerequisites() -> None:
    from test_ci import readme_commands

    _, setup_and_test = readme_commands()
    install = setup_and_test.index("pip install -e '.[test]'")
    assert setup_and_test.index("python tests/prereqs.py") > install  # with the test extra's packages
    assert setup_and_test.index("python tests/prereqs.py") < setup_and_test.index("pytest")
