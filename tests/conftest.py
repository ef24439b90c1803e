"""Shared fixtures: the real Kineto traces in ``../shared/traces`` beside the repository."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from export.mlflow_server import MlflowServer, running_server
from prereqs import pytest_configure  # noqa: F401 - the hook: importorskip fails in CI

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
KINETO_DIR = SHARED_TRACES / "kineto"
MLFLOW_MISSING = "mlflow is not installed (it is in the 'test' extra: pip install -e '.[test]')"


def _kineto_traces() -> list[Path]:
    return sorted(KINETO_DIR.glob("*.json*")) if KINETO_DIR.is_dir() else []


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``../shared/traces``; tests needing it are skipped when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"shared traces not found at {SHARED_TRACES}")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def kineto_traces(shared_traces: Path) -> list[Path]:
    """Every Kineto trace in ``../shared/traces/kineto``, sorted by name."""
    traces = _kineto_traces()
    if not traces:
        pytest.skip(f"no Kineto traces in {KINETO_DIR}")
    return traces


@pytest.fixture(scope="session")
def kineto_trace(kineto_traces: list[Path]) -> Callable[[str], Path]:
    """``kineto_trace("alexnet")``: the one shared Kineto trace whose name contains the text."""

    def find(part: str) -> Path:
        matches = [p for p in kineto_traces if part in p.name]
        if len(matches) != 1:
            raise LookupError(f"{len(matches)} shared traces match {part!r}")
        return matches[0]

    return find


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No OTEL_* or OTELPROF_* variable from the outer environment leaks into the test."""
    for name in list(os.environ):
        if name.startswith(("OTEL_", "OTELPROF_")):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real ``mlflow server`` on 127.0.0.1, started once for every test that asks for it
    (``tests/export/test_mlflow.py``, ``tests/ui/``); skipped when MLflow is not installed."""
    pytest.importorskip("mlflow", reason=MLFLOW_MISSING)
    with running_server(tmp_path_factory.mktemp("mlflow")) as server:
        yield server
