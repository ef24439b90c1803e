"""A live instrumentation session for tests: its own registry and exporter to a receiver."""

from __future__ import annotations

from pathlib import Path

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
