"""A live instrumentation session for tests: its own registry and exporter to a receiver."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

import otelprof
from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import Exporter
from otelprof.instrumentation import Session

#: One profiling window: step 2 warms up, steps 3 and 4 are recorded (no early window, no
#: triggers), for tests that add their profiler options and run id.
ONE_WINDOW = {
    "OTELPROF_TRIGGER_SIGNAL": "none",
    "OTELPROF_ANOMALY_FACTOR": "0",
    "OTELPROF_PROFILE_EARLY": "0",
    "OTELPROF_PROFILE_SKIP_FIRST": "2",
    "OTELPROF_PROFILE_WAIT": "0",
    "OTELPROF_PROFILE_WARMUP": "1",
    "OTELPROF_PROFILE_ACTIVE": "2",
    "OTELPROF_PROFILE_REPEAT": "1",
}


def both_metric_paths(receiver_port: int) -> dict[str, str]:
    """A training child's environment: this process's, with spans and metrics over OTLP/HTTP to
    127.0.0.1:``receiver_port`` (metrics pushed once, at shutdown) and ``/metrics`` served on a
    free port."""
    return {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver_port}",
        "OTEL_METRICS_EXPORTER": "prometheus,otlp",
        "OTEL_METRIC_EXPORT_INTERVAL": "60000",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
    }


def train(steps: int = 8, after_step: Callable[[], object] | None = None) -> None:
    """A small CPU loop over a DataLoader of ``steps`` batches (one update each); ``after_step``
    runs after each update (a user's ``prof.step``)."""
    import torch

    torch.manual_seed(0)
    batches: Any = torch.randn(steps * 4, 16)  # a tensor is a map-style dataset of its rows
    loader: Any = torch.utils.data.DataLoader(batches, batch_size=4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in loader:
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if after_step is not None:
            after_step()


def start(receiver_port: int, spool_dir: Path, **env: str) -> Session:
    """Instruments this process, exporting over OTLP/HTTP to 127.0.0.1:``receiver_port``;
    metrics on a free port. Call :func:`stop` at the end."""
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver_port}",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTELPROF_TRACE_DIR": f"{spool_dir}-traces",  # kept window traces beside the spool, not in ~
        **env,
    }
    registry = CollectorRegistry()
    exporter = Exporter(exporter_config_from_env(environ), spool_dir=spool_dir, registry=registry)
    session = otelprof.instrument(environ=environ, registry=registry, exporter=exporter)
    assert session is not None
    return session


def stop(session: Session) -> None:
    """Uninstruments (flushing the last steps) and delivers everything to the receiver."""
    otelprof.uninstrument()
    assert session.exporter is not None and session.exporter.flush(30)
    session.exporter.shutdown()
