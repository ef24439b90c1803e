"""Each entry point instruments a real training process, which exports its steps to a real
receiver: ``import otelprof.auto``, ``otelprof run``, ``opentelemetry-instrument``; and DataLoader
workers (fork) neither break nor duplicate anything."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from converter_helpers import native_required
from export.receivers import HttpReceiver, http_receiver

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STEPS = 5


def _run(command: list[str], rec: HttpReceiver, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTELPROF_RUN_ID": "entry",
        "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **extra,
    }
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Error in sitecustomize" not in out.stderr, out.stderr
    assert f"trained {STEPS}" in out.stdout
    return out


def _otelprof_run(workers: int, *flags: str) -> list[str]:
    script = [sys.executable, str(HERE / "train_loop.py"), str(STEPS), str(workers), *flags]
    return [sys.executable, "-m", "otelprof", "run", "--", *script]


def _steps(rec: HttpReceiver) -> list[int]:
    steps = [s for s in rec.spans if s.name == "train.step"]
    return [next(kv.value.int_value for kv in s.attributes if kv.key == "otelprof.step.number") for s in steps]


def test_import_otelprof_auto(tmp_path: Path) -> None:
    with http_receiver() as rec:
        _run([sys.executable, str(HERE / "train_loop.py"), str(STEPS), "0", "--auto"], rec, tmp_path)
    assert _steps(rec) == list(range(STEPS))


@pytest.mark.slow  # a training subprocess; test_import_otelprof_auto stays in the fast loop
def test_otelprof_run_with_dataloader_workers(tmp_path: Path) -> None:
    """Two forked DataLoader workers inherit the hooks but train nothing: steps once each."""
    command = _otelprof_run(workers=2)
    with http_receiver() as rec:
        _run(command, rec, tmp_path)
    assert _steps(rec) == list(range(STEPS))


@pytest.mark.slow  # a training subprocess; test_import_otelprof_auto stays in the fast loop
def test_otelprof_run_with_spawned_dataloader_workers(tmp_path: Path) -> None:
    """Spawned workers start a fresh interpreter with the bootstrap on PYTHONPATH; they load
    batches but train nothing: the job still runs, and its steps arrive once each."""
    with http_receiver() as rec:
        out = _run(_otelprof_run(2, "--spawn"), rec, tmp_path)
    assert _steps(rec) == list(range(STEPS))
    assert "cannot serve metrics" not in out.stderr


@pytest.mark.slow  # a training subprocess; test_import_otelprof_auto stays in the fast loop
def test_disabled_by_environment(tmp_path: Path) -> None:
    command = _otelprof_run(workers=0)
    with http_receiver() as rec:
        _run(command, rec, tmp_path, OTELPROF_ENABLED="false")
        _run(command, rec, tmp_path, OTEL_SDK_DISABLED="true")
    assert rec.requests == []
    assert not (tmp_path / "spool").exists() or not list((tmp_path / "spool").iterdir())


@pytest.mark.slow  # a training subprocess; test_import_otelprof_auto stays in the fast loop
def test_opentelemetry_instrument(tmp_path: Path) -> None:
    registered = [e.value for e in entry_points(group="opentelemetry_instrumentor") if e.name == "torch"]
    if "otelprof.instrumentor:TorchInstrumentor" not in registered:
        # CI installs the package (and sets this): there the entry point must be registered
        assert not native_required(), "entry point opentelemetry_instrumentor:torch missing"
        pytest.skip("otelprof is not installed (pip install -e .), so its entry point is not registered")
    tool = shutil.which("opentelemetry-instrument")
    assert tool is not None
    command = [tool, sys.executable, str(HERE / "train_loop.py"), str(STEPS), "0"]
    with http_receiver() as rec:
        # only otelprof's instrumentor is under test: the SDK's metric and log exporters off, and
        # spans by otelprof's own OTLP path (OTEL_TRACES_EXPORTER=none now silences it too)
        _run(
            command, rec, tmp_path, OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none"
        )
    assert _steps(rec) == list(range(STEPS))
