"""A real MLflow tracking server for the tests, started once per session (``mlflow_server`` in
``tests/conftest.py``): ``mlflow server`` on 127.0.0.1 (SQLite store, one worker, no job
execution) in its own process group, stopped with it. Used by ``tests/export/test_mlflow.py``
and ``tests/ui/``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Bounds the server's start (about 7 s on two busy cores); the log is shown when it runs out.
SERVER_START_TIMEOUT_S = 120.0
#: The client in the test process reports usage too unless told not to.
NO_TELEMETRY = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


def free_port() -> int:
    """A port nothing listens on now (this module stays free of grpc: tests/conftest.py imports it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class MlflowServer:
    url: str
    log: Path

    @property
    def traces_url(self) -> str:
        return f"{self.url}/v1/traces"


def log_tail(log: Path, lines: int = 80) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError as exc:
        return f"(no server log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        code = proc.poll()
        if code is not None:
            pytest.fail(f"mlflow server exited with status {code} before it was ready; its log:\n{log_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass  # not listening yet
        if time.monotonic() > deadline:
            pytest.fail(f"mlflow server not ready after {SERVER_START_TIMEOUT_S:.0f} s; its log:\n{log_tail(log)}")
        time.sleep(0.25)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member exists
        return True
    return True


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (``mlflow server`` and its uvicorn child), then
    SIGKILL to whatever is left after a grace period."""
    pgid = proc.pid  # start_new_session: the server leads its own group
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while _group_alive(pgid) and time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def running_server(root: Path) -> Iterator[MlflowServer]:
    """``mlflow server`` with its store under ``root``; the test process's MLflow client told
    not to report usage while it runs."""
    url = f"http://127.0.0.1:{free_port()}"
    log = root / "server.log"
    env = {**os.environ, **NO_TELEMETRY, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        url.rsplit(":", 1)[1],
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    monkeypatch = pytest.MonkeyPatch()
    try:
        for name, value in NO_TELEMETRY.items():
            monkeypatch.setenv(name, value)
        _wait_ready(proc, url, log)
        yield MlflowServer(url, log)
    finally:
        monkeypatch.undo()
        stop(proc)
