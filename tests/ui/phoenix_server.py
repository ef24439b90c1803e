"""A real Arize Phoenix server for ``tests/ui/test_phoenix_ui.py``.

Phoenix brings its own web stack (FastAPI, SQLAlchemy, strawberry, ...), so it is installed with
pip into a virtual environment of its own, never into the test environment, and run there as a
subprocess: ``python -m phoenix.server.main serve`` on 127.0.0.1 with free HTTP and gRPC ports,
a temporary working dir (``PHOENIX_WORKING_DIR``, its SQLite database) and telemetry off. It
takes OTLP/HTTP at ``/v1/traces`` and serves spans at ``GET /v1/projects/{project}/spans``.

The environment is built before the tests by ``tests/prereqs.py`` (``$OTELPROF_PHOENIX_VENV``,
else ``/tmp/otelprof-test-cache/arize-phoenix-<version>-py<major.minor>``); missing, the tests
skip, or fail in CI."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import prereqs
import pytest
from export.mlflow_server import free_port, log_tail, stop

VERSION = prereqs.PHOENIX_VERSION
START_TIMEOUT_S = 120.0


def ensure_installed() -> Path:
    """The Phoenix environment's python (installed by tests/prereqs.py, never here)."""
    return prereqs.phoenix_python()


@dataclass(frozen=True)
class PhoenixServer:
    url: str
    log: Path

    @property
    def traces_url(self) -> str:
        return f"{self.url}/v1/traces"

    def get(self, path: str, **query: Any) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})}"
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.load(response)

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span of the project, all pages (``GET /v1/projects/{project}/spans``)."""
        spans: list[dict[str, Any]] = []
        cursor = None
        while True:
            try:
                page = self.get(f"/v1/projects/{urllib.parse.quote(project)}/spans", limit=1000, cursor=cursor)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # no span of the project stored yet
                    return spans
                raise
            spans += page["data"]
            cursor = page.get("next_cursor")
            if not cursor:
                return spans


@contextlib.contextmanager
def running_server(python: Path, root: Path) -> Iterator[PhoenixServer]:
    port, grpc_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "phoenix.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PHOENIX_", "OTEL_"))},
        "PHOENIX_WORKING_DIR": str(root),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "DO_NOT_TRACK": "true",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(python), "-m", "phoenix.server.main", "serve"],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.skip(f"phoenix exited with status {proc.returncode} at start; its log:\n{log_tail(log, 40)}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                pytest.skip(f"phoenix not ready after {START_TIMEOUT_S:.0f} s; its log:\n{log_tail(log, 40)}")
            time.sleep(0.5)
        yield PhoenixServer(url, log)
    finally:
        stop(proc)
