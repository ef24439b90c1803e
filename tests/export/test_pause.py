"""The exporter's worker steps aside while a user's with_stack profile runs (capture/coexist.py):
``pause_worker`` stops the thread, even with a request in flight to a backend that does not
answer (the send is interrupted and goes first again), and ``resume_worker`` delivers it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import Exporter

from .receivers import GrpcReceiver, GrpcReply, HttpReceiver, Reply, grpc_receiver, http_receiver, wait_until


def _http() -> tuple[AbstractContextManager[Any], dict[str, str]]:
    rec = HttpReceiver(script=[Reply(delay_s=30.0)])  # the first request: kept, answered late
    return http_receiver(rec), {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}


def _grpc() -> tuple[AbstractContextManager[Any], dict[str, str]]:
    rec = GrpcReceiver(script=[GrpcReply(delay_s=30.0)])
    return grpc_receiver(rec), {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_INSECURE": "true"}


@pytest.mark.parametrize("make", [_http, _grpc], ids=["http", "grpc"])
def test_a_pause_interrupts_a_stalled_send_and_resume_delivers_it(
    tmp_path: Path, make: Callable[[], tuple[AbstractContextManager[Any], dict[str, str]]]
) -> None:
    server, env = make()
    with server as rec:
        endpoint = f"http://127.0.0.1:{rec.port}"
        config = exporter_config_from_env({**env, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
        exporter = Exporter(config, spool_dir=tmp_path, registry=CollectorRegistry(), probe_interval_s=0.2)
        exporter.submit(b"")  # an empty ExportTraceServiceRequest: valid on the wire
        wait_until(lambda: len(rec.requests) == 1)  # in flight: the server holds it
        exporter.pause_worker(5.0)
        assert not exporter._thread.is_alive()  # stopped, the stalled send interrupted
        exporter.submit(b"")  # queued while paused
        assert len(rec.requests) == 1
        exporter.resume_worker()
        assert exporter.flush(20)
        # the interrupted request again (at least once, never lost), then the one queued meanwhile
        assert len(rec.requests) == 3
        assert exporter.counters.requests_exported == 2 and exporter.counters.requests_dropped == 0
        assert exporter.counters.requests_spooled == 0
        exporter.shutdown()
