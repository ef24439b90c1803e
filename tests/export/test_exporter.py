"""The background exporter against real receivers: nothing lost, nothing blocks the producer."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from converter_helpers import shared_trace
from prometheus_client import CollectorRegistry, generate_latest

from otelprof.converter import convert
from otelprof.export import ExporterConfig, exporter_config_from_env
from otelprof.export.destination import destination_id
from otelprof.export.exporter import Exporter
from otelprof.export.spool import Spool

from .receivers import HttpReceiver, Reply, free_port, http_receiver, wait_until


def _exporter(
    config: ExporterConfig, spool_dir: Path, queue_max_bytes: int = 64 << 20, overflow_max_bytes: int = 64 << 20
) -> Exporter:
    """Test timings: fast backoff and probing."""
    return Exporter(
        config,
        spool_dir=spool_dir,
        queue_max_bytes=queue_max_bytes,
        overflow_max_bytes=overflow_max_bytes,
        backoff_s=0.01,
        max_backoff_s=0.05,
        probe_interval_s=0.05,
    )


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    return convert(shared_trace("critical_path"), detail="full", max_request_bytes=8 * 1024).requests


def _config(port: int) -> ExporterConfig:
    return exporter_config_from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_TIMEOUT": "2000"}
    )


def _submit_all(exporter: Exporter, requests: list[bytes]) -> float:
    """Submits every request; returns the slowest submit() call in seconds."""
    worst = 0.0
    for r in requests:
        start = time.perf_counter()
        exporter.submit(r)
        worst = max(worst, time.perf_counter() - start)
    return worst


def test_everything_arrives_in_order(tmp_path: Path, requests: list[bytes]) -> None:
    with http_receiver() as rec:
        exporter = _exporter(_config(rec.port), tmp_path)
        _submit_all(exporter, requests)
        assert exporter.flush(30)
        exporter.shutdown()
    assert [r.SerializeToString() for r in rec.requests] == requests
    assert exporter.counters.requests_exported == len(requests)
    assert exporter.spool.records() == []


def test_receiver_down_at_start_then_up_loses_nothing(tmp_path: Path, requests: list[bytes]) -> None:
    port = free_port()
    exporter = _exporter(_config(port), tmp_path)
    worst = _submit_all(exporter, requests)
    assert exporter.flush(30)
    assert exporter.counters.requests_spooled == len(requests)  # nowhere to send: all spooled
    with http_receiver(HttpReceiver(port=port)) as rec:
        wait_until(lambda: len(rec.requests) == len(requests))
        exporter.shutdown()
    assert [r.SerializeToString() for r in rec.requests] == requests  # replayed in order
    assert exporter.counters.requests_replayed == len(requests)
    assert exporter.spool.records() == []
    # while the backend was down, submit() never waited on the network (timeout is 2 s)
    assert worst < 0.5


def test_503_then_success_is_retried(tmp_path: Path, requests: list[bytes]) -> None:
    with http_receiver(HttpReceiver(script=[Reply(503, message="busy")])) as rec:
        exporter = _exporter(_config(rec.port), tmp_path)
        exporter.submit(requests[0])
        assert exporter.flush(30)
        exporter.shutdown()
    assert [r.SerializeToString() for r in rec.requests] == [requests[0]]
    assert (exporter.counters.retries, exporter.counters.requests_exported) == (1, 1)


def test_non_retryable_rejection_is_dropped_and_counted(
    tmp_path: Path, requests: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    with http_receiver(HttpReceiver(script=[Reply(400, message="bad span"), Reply(400, message="bad span")])) as rec:
        exporter = _exporter(_config(rec.port), tmp_path)
        _submit_all(exporter, requests[:3])
        assert exporter.flush(30)
        exporter.shutdown()
    assert exporter.counters.requests_dropped == 2
    assert [r.SerializeToString() for r in rec.requests] == requests[2:3]
    assert [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()] == [
        "the backend rejected a request, dropped: HTTP 400: bad span"
    ]


def test_no_endpoint_spools_everything(tmp_path: Path, requests: list[bytes]) -> None:
    exporter = _exporter(exporter_config_from_env({}), tmp_path)
    _submit_all(exporter, requests)
    assert exporter.flush(30)
    exporter.shutdown()
    assert [data for _p, data in exporter.spool] == requests


def test_full_queue_spools_from_submit(tmp_path: Path, requests: list[bytes]) -> None:
    port = free_port()
    exporter = _exporter(_config(port), tmp_path, queue_max_bytes=1)
    _submit_all(exporter, requests)
    exporter.shutdown(timeout_s=1)
    assert exporter.counters.requests_spooled == len(requests)
    assert sorted(data for _p, data in exporter.spool) == sorted(requests)


def test_self_telemetry_in_the_prometheus_registry(tmp_path: Path, requests: list[bytes]) -> None:
    registry = CollectorRegistry()
    with http_receiver(HttpReceiver(script=[Reply(503, message="busy")])) as rec:
        exporter = Exporter(
            _config(rec.port), spool_dir=tmp_path, backoff_s=0.01, max_backoff_s=0.05, registry=registry
        )
        _submit_all(exporter, requests)
        assert exporter.flush(30)
        exporter.shutdown()
    scrape = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples}
    assert scrape[("otelprof_export_requests_total", (("result", "exported"), ("signal", "traces")))] == len(requests)
    assert scrape[("otelprof_export_requests_total", (("result", "dropped"), ("signal", "traces")))] == 0
    assert scrape[("otelprof_export_retries_total", (("signal", "traces"),))] == 1
    assert scrape[("otelprof_export_duration_seconds_count", (("signal", "traces"),))] == len(requests) + 1
    assert scrape[("otelprof_export_queue_requests", (("signal", "traces"),))] == 0
    assert scrape[("otelprof_export_spool_bytes", (("signal", "traces"),))] == 0
    text = generate_latest(registry).decode()
    assert 'otelprof_export_requests_total{result="exported",signal="traces"}' in text


def test_full_queue_and_full_spool_writer_drop_and_count(
    tmp_path: Path, requests: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    exporter = _exporter(_config(free_port()), tmp_path, queue_max_bytes=1, overflow_max_bytes=1)
    worst = _submit_all(exporter, requests)
    exporter.shutdown(timeout_s=1)
    assert exporter.counters.requests_dropped == len(requests)
    assert exporter.spool.records() == []
    assert [r.getMessage() for r in caplog.records if "both full" in r.getMessage()] == [
        "export queue and spool writer are both full: dropping requests"
    ]
    assert worst < 0.5


def test_spool_of_an_earlier_run_is_replayed_first_on_start(tmp_path: Path, requests: list[bytes]) -> None:
    with http_receiver() as rec:
        earlier = Spool(tmp_path)  # an earlier run with the same destination
        for r in requests[:5]:
            earlier.write(r, destination_id(_config(rec.port)))
        exporter = _exporter(_config(rec.port), tmp_path)
        _submit_all(exporter, requests[5:])
        wait_until(lambda: len(rec.requests) == len(requests))
        exporter.shutdown()
    assert [r.SerializeToString() for r in rec.requests] == requests  # the old ones first, in order
    assert exporter.counters.requests_replayed >= 5
    assert exporter.spool.records() == []


def test_one_replayer_per_spool_directory(tmp_path: Path, requests: list[bytes]) -> None:
    port = free_port()
    spool = Spool(tmp_path)
    spool.write(requests[0], destination_id(_config(port)))  # the exporter's own destination
    with spool.replay_lock() as first, Spool(tmp_path).replay_lock() as second:
        assert (first, second) == (True, False)
        with http_receiver(HttpReceiver(port=port)) as rec:  # an exporter starting meanwhile leaves the record alone
            exporter = _exporter(_config(rec.port), tmp_path)
            time.sleep(0.3)
            assert rec.requests == [] and len(spool.records()) == 1
    with Spool(tmp_path).replay_lock() as after:
        assert after  # the kernel lock went with the holder's descriptor
    exporter.shutdown(timeout_s=1)


def test_several_threads_submit_concurrently(tmp_path: Path, requests: list[bytes]) -> None:
    chunks = [requests[i::4] for i in range(4)]
    with http_receiver() as rec:
        exporter = _exporter(_config(rec.port), tmp_path)
        threads = [threading.Thread(target=_submit_all, args=(exporter, chunk)) for chunk in chunks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert exporter.flush(30)
        exporter.shutdown()
    received = [r.SerializeToString() for r in rec.requests]
    assert sorted(received) == sorted(requests)  # each exactly once
    for chunk in chunks:  # and each thread's own requests in the order it submitted them
        assert [r for r in received if r in chunk] == chunk
    assert exporter.counters.requests_exported == len(requests)
