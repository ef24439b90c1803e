"""No delay a server asks for can stop the export worker (issue 14, item 2).

``Retry-After`` as seconds or as an HTTP date, and gRPC's ``RetryInfo``, come from the server:
huge (``1e10``: ``OverflowError`` in ``Condition.wait`` killed the worker for good), infinite,
NaN, negative, far-future or unreadable values are bounded, and the worker loop itself survives
whatever a transport raises. Each test answers from a real receiver, then checks that the
requests after the throttle still arrive, in order, and that ``flush()`` is True.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from converter_helpers import shared_trace
from prometheus_client import CollectorRegistry

from otelprof.converter import convert
from otelprof.export import ExporterConfig, exporter_config_from_env
from otelprof.export.exporter import Exporter
from otelprof.export.http import _retry_after
from otelprof.export.result import MAX_SERVER_DELAY_S, ExportResult

from .receivers import GrpcReceiver, GrpcReply, HttpReceiver, Reply, grpc_receiver, http_receiver, wait_until

#: The exporter under test bounds server delays at this (the default is MAX_SERVER_DELAY_S), so
#: a clamped delay passes within the test; the backoff cap is below it, so a clamped delay takes
#: the "long throttle" path: spool, then probe once the delay has passed.
TEST_MAX_SERVER_DELAY_S = 0.5
MAX_BACKOFF_S = 0.2

#: Retry-After values a server (or a proxy in front of it) may send.
RETRY_AFTER = {
    "huge-seconds": "1e10",
    "infinite": "inf",
    "overflowing": "1e400",
    "nan": "nan",
    "negative": "-5",
    "far-future-date": "Fri, 31 Dec 9999 23:59:59 GMT",
    "past-date": "Thu, 01 Jan 1970 00:00:00 GMT",
    "unreadable": "soon, maybe",
}


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    return convert(shared_trace("critical_path"), detail="full", max_request_bytes=8 * 1024).requests[:8]


def _config(protocol: str, port: int) -> ExporterConfig:
    return exporter_config_from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "10000",
        }
    )


def _exporter(config: ExporterConfig, spool_dir: Path, registry: CollectorRegistry) -> Exporter:
    return Exporter(
        config,
        spool_dir=spool_dir,
        backoff_s=0.01,
        max_backoff_s=MAX_BACKOFF_S,
        probe_interval_s=0.05,
        max_server_delay_s=TEST_MAX_SERVER_DELAY_S,
        registry=registry,
    )


def _check_delivered(exporter: Exporter, registry: CollectorRegistry, received: list[bytes], sent: list[bytes]) -> None:
    assert received == sent  # every request, in order, none lost
    assert exporter.counters.requests_dropped == 0
    assert (
        registry.get_sample_value("otelprof_export_worker_errors_total", {"signal": "traces"}) == 0
    )  # bounded, not caught


@pytest.mark.parametrize("value", list(RETRY_AFTER.values()), ids=list(RETRY_AFTER))
def test_any_retry_after_leaves_the_worker_running(value: str, tmp_path: Path, requests: list[bytes]) -> None:
    half = len(requests) // 2
    throttle = [Reply(429, {"Retry-After": value}, message="slow down"), Reply(503, {"Retry-After": value})]
    registry = CollectorRegistry()
    with http_receiver(HttpReceiver(script=throttle)) as rec:
        exporter = _exporter(_config("http/protobuf", rec.port), tmp_path, registry)
        for r in requests[:half]:
            exporter.submit(r)
        wait_until(lambda: len(rec.requests) == half)
        assert exporter.flush(30)
        for r in requests[half:]:  # after the throttle: still sent
            exporter.submit(r)
        wait_until(lambda: len(rec.requests) == len(requests))
        assert exporter.flush(30)
        assert exporter._thread.is_alive()
        exporter.shutdown()
        received = [r.SerializeToString() for r in rec.requests]
    _check_delivered(exporter, registry, received, requests)
    assert exporter.spool.records() == []


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE], ids=lambda c: c.name.lower()
)
def test_a_huge_grpc_retry_info_leaves_the_worker_running(
    code: grpc.StatusCode, tmp_path: Path, requests: list[bytes]
) -> None:
    """RetryInfo's delay is a protobuf Duration: up to 315,576,000,000 s (10,000 years)."""
    throttle = [GrpcReply(code, "slow down", retry_delay_s=315_576_000_000.0)] * 2
    registry = CollectorRegistry()
    with grpc_receiver(GrpcReceiver(script=list(throttle))) as rec:
        exporter = _exporter(_config("grpc", rec.port), tmp_path, registry)
        for r in requests:
            exporter.submit(r)
        wait_until(lambda: len(rec.requests) == len(requests))
        assert exporter.flush(30)
        assert exporter._thread.is_alive()
        exporter.shutdown()
        received = [r.SerializeToString() for r in rec.requests]
    _check_delivered(exporter, registry, received, requests)


def test_retry_after_is_bounded_by_default() -> None:
    """Without a test cap: the transport's own bound (MAX_SERVER_DELAY_S), for every shape."""
    assert _retry_after("1e10") == _retry_after("inf") == _retry_after("1e400") == MAX_SERVER_DELAY_S
    assert _retry_after("Fri, 31 Dec 9999 23:59:59 GMT") == MAX_SERVER_DELAY_S
    assert _retry_after("-5") == _retry_after("Thu, 01 Jan 1970 00:00:00 GMT") == 0.0
    assert _retry_after("nan") is None and _retry_after("soon, maybe") is None and _retry_after(None) is None
    assert _retry_after("7") == 7.0


def test_the_worker_survives_a_transport_that_raises_or_returns_nonsense(
    tmp_path: Path, requests: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """Any ``send`` (a transport of a later version, a bug): the exporter bounds the delays it
    returns itself, and an exception costs no request: it is logged once, counted, and the
    request in hand is spooled, then replayed."""
    registry = CollectorRegistry()
    with http_receiver() as rec:
        exporter = _exporter(_config("http/protobuf", rec.port), tmp_path, registry)
        real_send = exporter._send
        faults: list[object] = [RuntimeError("a bug"), float("inf"), float("nan"), 1e300, RuntimeError("again")]

        def faulty_send(request: bytes) -> ExportResult:
            if faults:
                fault = faults.pop(0)
                if isinstance(fault, Exception):
                    raise fault
                assert isinstance(fault, float)
                return ExportResult(False, retryable=True, retry_after_s=fault, message="throttled")
            return real_send(request)

        exporter._send = faulty_send
        with caplog.at_level(logging.WARNING):
            for r in requests:
                exporter.submit(r)
            wait_until(lambda: len(rec.requests) >= len(requests) and not exporter.spool.records())
            assert exporter.flush(30)
            assert exporter._thread.is_alive()
        exporter.shutdown()
        received = [r.SerializeToString() for r in rec.requests]
    assert sorted(received) == sorted(requests)  # none lost (order: a spooled one replays later)
    assert exporter.counters.worker_errors == 2
    assert registry.get_sample_value("otelprof_export_worker_errors_total", {"signal": "traces"}) == 2
    assert exporter.counters.requests_dropped == 0
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("export worker")] == [
        "export worker error (the worker goes on)"
    ]
