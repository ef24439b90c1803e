"""``otelprof demo`` (the README's first command): a real training run under ``otelprof run``,
exporting to the endpoint when one is set and to the spool otherwise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from export.receivers import http_receiver

from otelprof.export.spool import Spool
from otelprof.otlp import ids

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


def _demo(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    environ.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OTELPROF_SPOOL_DIR=str(tmp_path / "spool"),
        OTELPROF_RUN_ID="demo-test",
        **env,
    )
    command = [sys.executable, "-m", "otelprof", "demo", "--steps", str(STEPS), "--out", str(tmp_path / "out")]
    out = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "Error in sitecustomize" not in out.stderr
    # The README's first screen: no warning of otelprof's, Python's or torch's ("Failed to
    # initialize NumPy" when the `torch` extra's numpy is missing)
    warned = [line for line in out.stderr.splitlines() if re.search(r"warn|numpy", line, re.I)]
    assert not warned, out.stderr
    return out


@pytest.mark.slow
def test_demo_exports_to_the_endpoint(tmp_path: Path) -> None:
    with http_receiver() as rec:
        out = _demo(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{rec.port}")
    steps = [s for s in rec.spans if s.name == "train.step"]
    assert len(steps) == STEPS
    by_trace: dict[bytes, set[str]] = {}
    for span in rec.spans:
        by_trace.setdefault(span.trace_id, set()).add(span.name)
    for n in (6, 7, 8):  # the demo's window: operator spans in the profiled steps' traces
        names = by_trace[ids.trace_id(f"step|demo-test|{n}")]
        assert {"train.step", f"ProfilerStep#{n}", "aten::linear", "aten::mm"} <= names
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["windows"]["schedule"] == 1
    assert summary["requests"]["exported"] == len(rec.requests) and summary["requests"]["spooled"] == 0
    assert f"sent to http://127.0.0.1:{rec.port}/v1/traces: {len(rec.requests)} OTLP requests exported" in out.stdout
    assert ids.trace_id("step|demo-test|6").hex() in out.stdout
    assert not Spool(tmp_path / "spool").records()


@pytest.mark.slow
def test_demo_without_endpoint_keeps_everything_in_the_spool(tmp_path: Path) -> None:
    out = _demo(tmp_path)
    records = Spool(tmp_path / "spool").records()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["endpoint"] is None and summary["requests"]["spooled"] == len(records) > 0
    assert f"{len(records)} OTLP requests kept in the spool {tmp_path / 'spool'}" in out.stdout
    assert "otelprof spool replay" in out.stdout
