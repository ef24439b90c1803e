"""``otelprof import`` as a command: help, progress line, summary, no torch needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from converter_helpers import shared_trace
from export.receivers import http_receiver
from importer.helpers import import_env, run_import

from otelprof.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_help_documents_exit_codes_and_resume(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", "--help"]) == 0
    out = capsys.readouterr().out
    for text in ("--resume", "--ledger", "--progress", "130", "~/.cache/otelprof/imports", "Nsight Systems"):
        assert text in out


def test_progress_line_only_when_asked_off_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = shared_trace("alexnet")
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        assert run_import(trace, "--ledger", tmp_path / "a.json") == 0
        plain = capsys.readouterr().err
        assert run_import(trace, "--ledger", tmp_path / "b.json", "--progress") == 0
        shown = capsys.readouterr().err
    assert "\r" not in plain and "events/s" in plain  # the summary line
    assert plain.startswith("imported 1 of 1 files: 1,408 events as 523 spans in 1 requests")
    assert f"1 requests sent to http://127.0.0.1:{rec.port}/v1/traces" in plain
    assert "\rimport [####################] 100%  1/1 files  1,408 events" in shown


def test_import_needs_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None; from otelprof.cli import main; "
        f"sys.exit(main(['-q', 'import', {str(shared_trace('cpu_only'))!r}, '--ledger', {str(tmp_path / 'l.json')!r}]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(PYTHONPATH=str(ROOT), OTELPROF_SPOOL_DIR=str(tmp_path / "spool"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "spool").glob("*.otlp"))) == 1


def test_export_disabled_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with import_env(tmp_path, None), pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_SDK_DISABLED", "true")
        assert run_import(shared_trace("cpu_only")) == 1
    assert "OTEL_SDK_DISABLED" in capsys.readouterr().err
