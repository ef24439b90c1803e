"""The README's two commands (its first code block) and the CI script stay in step."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text("utf-8")
    match = re.search(r"^```[a-z]*\n(.*?)\n```\n", readme, re.DOTALL | re.MULTILINE)
    assert match, "README.md must have a code block"
    return match.group(1).splitlines()


def test_readme_opens_with_two_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    setup_and_run, setup_and_test = commands
    assert setup_and_run.startswith("python3 -m venv .venv && ")
    assert setup_and_run.endswith(" && otelprof demo")
    assert setup_and_test.startswith("python3 -m venv .venv && ")
    assert "pip install torch==2.13.0 && " in setup_and_test, "torch must be pinned before anything pulls it in"


def test_ci_runs_the_readme_test_command() -> None:
    script = (REPO_ROOT / ".ci" / "run").read_text("utf-8")
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    commands = [line for line in script.splitlines() if line.strip() and not line.startswith(("#", "set ", "cd "))]
    # first the README's test command, verbatim; then CI's own steps (the sanitizer run:
    # tests/native/test_sanitize_setup.py)
    assert commands[0] == readme_commands()[1]
