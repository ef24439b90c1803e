"""The tests' prerequisites (tests/prereqs.py): a missing one fails in CI and skips elsewhere, and
no test installs software (only prereqs.py, run by the README's test command, does)."""

from __future__ import annotations

import re
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
