"""Fault tests for the exporter against real receivers on 127.0.0.1.

Each asserts that every span arrives (at least once; a duplicate only where the answer to a
request was lost and the specification allows the retry), that the counters say what happened,
and that the producer's ``submit()`` stayed non-blocking: its worst latency is checked against
a bound far below the export timeout, one only blocking on the network can break.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from converter_helpers import shared_trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from otelprof.converter import convert
from otelprof.export import ExporterConfig, exporter_config_from_env
from otelprof.export.exporter import Exporter

from .receivers import GrpcReceiver, GrpcReply, HttpReceiver, Reply, free_port, grpc_receiver, http_receiver, wait_until

TIMEOUT_MS = 10_000
#: Far below the 10 s export timeout: only a submit() that waits on the network can exceed it.
SUBMIT_BOUND_S = 1.0
PROTOCOLS = ["http/protobuf", "grpc"]
#: Our backoff starts at 10 ms; servers may ask for up to this long before we spool instead.
MAX_BACKOFF_S = 2.0


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    return convert(shared_trace("critical_path"), detail="full", max_request_bytes=8 * 1024).requests[:12]


def _config(protocol: str, port: int, timeout_ms: int = TIMEOUT_MS) -> ExporterConfig:
    return exporter_config_from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": str(timeout_ms),
        }
    )


@dataclass
class Script:
    """What the receiver answers, in order, for each protocol (then success)."""

    http: list[Reply] = field(default_factory=list)
    grpc: list[GrpcReply] = field(default_factory=list)


def _receiver(
    protocol: str, port: int = 0, script: Script | None = None
) -> AbstractContextManager[HttpReceiver | GrpcReceiver]:
    script = script or Script()
    if protocol == "grpc":
        return grpc_receiver(GrpcReceiver(port=port, script=list(script.grpc)))
    return http_receiver(HttpReceiver(port=port, script=list(script.http)))


def _exporter(
    config: ExporterConfig, spool_dir: Path, registry: CollectorRegistry | None = None, spool_max_bytes: int = 1 << 30
) -> Exporter:
    """Test timings (fast backoff and probing); a registry of its own, so counts start at zero."""
    return Exporter(
        config,
        spool_dir=spool_dir,
        spool_max_bytes=spool_max_bytes,
        backoff_s=0.01,
        max_backoff_s=MAX_BACKOFF_S,
        probe_interval_s=0.05,
        registry=registry or CollectorRegistry(),
    )


class Producer:
    """Submits like a training loop and keeps the slowest submit() call."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self.worst_s = 0.0

    def submit(self, requests: list[bytes]) -> None:
        for r in requests:
            start = time.perf_counter()
            self.exporter.submit(r)
            self.worst_s = max(self.worst_s, time.perf_counter() - start)


def _received(rec: HttpReceiver | GrpcReceiver) -> list[bytes]:
    with rec.lock:
        return [r.SerializeToString() for r in rec.requests]


def _scrape(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, {"signal": "traces", **labels})
    return 0.0 if value is None else value


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_receiver_restarted_mid_stream(protocol: str, tmp_path: Path, requests: list[bytes]) -> None:
    port = free_port()
    half = len(requests) // 2
    with _receiver(protocol, port) as rec:
        exporter = _exporter(_config(protocol, port), tmp_path)
        producer = Producer(exporter)
        producer.submit(requests[:half])
        wait_until(lambda: len(rec.requests) == half)
    producer.submit(requests[half:])  # the receiver is gone: these are spooled
    wait_until(lambda: exporter.counters.requests_spooled == len(requests) - half)
    with _receiver(protocol, port) as restarted:
        wait_until(lambda: len(restarted.requests) == len(requests) - half)
        exporter.shutdown()
    assert _received(rec) + _received(restarted) == requests  # in order, none twice
    c = exporter.counters
    rest = len(requests) - half
    assert (c.requests_exported, c.requests_spooled, c.requests_replayed) == (half, rest, rest)
    assert exporter.spool.records() == []
    assert producer.worst_s < SUBMIT_BOUND_S


# (protocol, scripted answers, retries expected): the spec's retryable answers
RETRYABLE = {
    "grpc-unavailable": ("grpc", Script(grpc=[GrpcReply(grpc.StatusCode.UNAVAILABLE, "restarting")]), 1),
    "grpc-resource-exhausted-retryinfo": (
        "grpc",
        Script(grpc=[GrpcReply(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", retry_delay_s=0.2)] * 2),
        2,
    ),
    "http-429-retry-after": ("http/protobuf", Script(http=[Reply(429, {"Retry-After": "1"}, message="slow down")]), 1),
    "http-503": ("http/protobuf", Script(http=[Reply(503, message="busy")] * 2), 2),
}


@pytest.mark.parametrize("fault", list(RETRYABLE), ids=list(RETRYABLE))
def test_retryable_answers_are_retried_and_nothing_is_lost(fault: str, tmp_path: Path, requests: list[bytes]) -> None:
    protocol, script, retries = RETRYABLE[fault]
    with _receiver(protocol, script=script) as rec:
        registry = CollectorRegistry()
        exporter = _exporter(_config(protocol, rec.port), tmp_path, registry)
        producer = Producer(exporter)
        started = time.monotonic()
        producer.submit(requests)
        assert exporter.flush(30)
        elapsed = time.monotonic() - started
        exporter.shutdown()
    assert _received(rec) == requests  # a refused request was never stored: no duplicates
    assert (exporter.counters.retries, exporter.counters.requests_exported) == (retries, len(requests))
    assert _scrape(registry, "otelprof_export_retries_total") == retries
    if fault == "http-429-retry-after":
        assert elapsed >= 1.0  # the server's Retry-After was honoured (a lower bound: noise only adds)
    assert producer.worst_s < SUBMIT_BOUND_S


def test_a_throttle_longer_than_the_backoff_cap_spools_then_replays(tmp_path: Path, requests: list[bytes]) -> None:
    """Retry-After beyond the cap: the worker does not sleep on it (the queue would back up);
    the request is spooled and replayed, first, once the server's delay has passed."""
    script = Script(http=[Reply(429, {"Retry-After": "3"}, message="slow down")])
    with _receiver("http/protobuf", script=script) as rec:
        exporter = _exporter(_config("http/protobuf", rec.port), tmp_path)
        producer = Producer(exporter)
        started = time.monotonic()
        producer.submit(requests)
        wait_until(lambda: len(rec.requests) == len(requests))
        elapsed = time.monotonic() - started
        exporter.shutdown()
    assert _received(rec) == requests  # order kept: later requests waited behind the spool
    c = exporter.counters
    n = len(requests)
    assert (c.retries, c.requests_exported, c.requests_spooled, c.requests_replayed) == (0, 0, n, n)
    assert elapsed >= 3.0  # the server's delay was honoured (a lower bound: noise only adds)
    assert producer.worst_s < SUBMIT_BOUND_S


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_partial_success_is_counted_and_logged_once(
    protocol: str, tmp_path: Path, requests: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    script = Script(
        grpc=[GrpcReply(rejected_spans=3, message="span too old")] * 2,
        http=[Reply(rejected_spans=3, message="span too old")] * 2,
    )
    registry = CollectorRegistry()
    with _receiver(protocol, script=script) as rec:
        exporter = _exporter(_config(protocol, rec.port), tmp_path, registry)
        Producer(exporter).submit(requests)
        assert exporter.flush(30)
        exporter.shutdown()
    assert _received(rec) == requests
    assert exporter.counters.spans_rejected == 6
    assert _scrape(registry, "otelprof_export_spans_rejected_total") == 6
    assert [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()] == [
        "the backend rejected 3 spans: span too old"
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_receiver_slower_than_the_timeout(protocol: str, tmp_path: Path, requests: list[bytes]) -> None:
    """The first answer comes after the timeout: the request is sent again (its answer was lost,
    so the receiver may hold it twice), and everything else follows in order."""
    timeout_ms = 2_000
    script = Script(grpc=[GrpcReply(delay_s=3.0)], http=[Reply(delay_s=3.0)])
    with _receiver(protocol, script=script) as rec:
        exporter = _exporter(_config(protocol, rec.port, timeout_ms), tmp_path)
        producer = Producer(exporter)
        producer.submit(requests)
        assert exporter.flush(60)
        exporter.shutdown()
    received = _received(rec)
    assert received[0] == requests[0]
    assert received[1:] == requests  # the timed-out request once more, then the rest in order
    assert exporter.counters.retries == 1
    assert exporter.counters.requests_exported == len(requests)
    assert producer.worst_s < timeout_ms / 1000 / 4


def test_sigkill_while_spooling_then_restart_loses_only_the_request_in_flight(
    tmp_path: Path, requests: list[bytes]
) -> None:
    """A job with its backend down spools; it is SIGKILLed mid-stream; the next start replays
    the spool to the (now reachable) backend. Every request the job saw spooled arrives, in order."""
    port = free_port()
    payloads = tmp_path / "payloads"
    payloads.mkdir()
    for i, r in enumerate(requests):
        (payloads / f"{i:04d}").write_bytes(r)
    progress = tmp_path / "progress"
    script = textwrap.dedent(
        f"""
        import pathlib
        from otelprof.export import exporter_config_from_env
        from otelprof.export.exporter import Exporter
        cfg = exporter_config_from_env({{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:{port}"}})
        exporter = Exporter(cfg, spool_dir={str(tmp_path / "spool")!r}, probe_interval_s=3600)
        progress = open({str(progress)!r}, "a")
        for i, path in enumerate(sorted(pathlib.Path({str(payloads)!r}).iterdir())):
            exporter.submit(path.read_bytes())
            exporter.flush(30)  # spooled (fsync'd) before we say so
            progress.write(f"{{i}}\\n"); progress.flush()
        while True:  # keep writing the last request until killed: a write is always in flight
            exporter.submit(path.read_bytes())
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    wait_until(lambda: progress.exists() and len(progress.read_text().split()) == len(requests))
    time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    confirmed = len(progress.read_text().split())
    assert confirmed == len(requests)
    with http_receiver(HttpReceiver(port=port)) as rec:
        exporter = _exporter(_config("http/protobuf", port), tmp_path / "spool")  # the next start
        wait_until(lambda: not exporter.spool.records())
        exporter.shutdown()
    received = _received(rec)
    assert received[: len(requests)] == requests  # every confirmed request, in order
    assert set(received[len(requests) :]) <= {requests[-1]}  # then the repeats of the last one
    for data in received:
        ExportTraceServiceRequest.FromString(data)
    assert exporter.counters.requests_replayed == len(received)


def test_full_spool_evicts_the_oldest_and_counts(tmp_path: Path, requests: list[bytes]) -> None:
    port = free_port()
    keep = sum(len(r) for r in requests[-4:])  # room for about the last four requests
    registry = CollectorRegistry()
    exporter = _exporter(_config("http/protobuf", port), tmp_path, registry, spool_max_bytes=keep)
    producer = Producer(exporter)
    producer.submit(requests)
    assert exporter.flush(30)
    evicted = int(_scrape(registry, "otelprof_export_spool_evicted_requests_total"))
    assert evicted >= len(requests) - 4 and evicted == exporter.spool.counters.evicted
    with http_receiver(HttpReceiver(port=port)) as rec:
        wait_until(lambda: len(rec.requests) == len(requests) - evicted)
        exporter.shutdown()
    assert _received(rec) == requests[evicted:]  # the oldest went first; every loss is counted
    assert exporter.counters.requests_spooled == len(requests)
    assert producer.worst_s < SUBMIT_BOUND_S


@pytest.fixture(scope="module")
def big_requests() -> Iterator[list[bytes]]:
    """A large trace at full detail, split at the default 3 MiB."""
    yield convert(shared_trace("nccl_data"), detail="full").requests


def test_requests_respect_the_receivers_4mib_limit(big_requests: list[bytes], tmp_path: Path) -> None:
    """gRPC servers (the Collector's included) refuse messages over 4 MiB by default: every
    request the converter makes fits, and arrives through a receiver with that default."""
    assert len(big_requests) > 1 and max(map(len, big_requests)) <= 4 * 1024 * 1024
    with grpc_receiver() as rec:  # grpc's default max_receive_message_length: 4 MiB
        exporter = _exporter(_config("grpc", rec.port), tmp_path)
        Producer(exporter).submit(big_requests)
        assert exporter.flush(60)
        exporter.shutdown()
    assert _received(rec) == big_requests
    assert exporter.counters.requests_dropped == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_over_the_limit_is_dropped_with_the_backends_message(
    protocol: str, tmp_path: Path, requests: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """Resending a request the receiver refuses for its size would never succeed: it is dropped,
    counted and logged once with the backend's reason, and what follows still arrives."""
    oversized = ExportTraceServiceRequest.FromString(requests[0])
    span = oversized.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.add(key="padding").value.string_value = "x" * (4 * 1024 * 1024)
    with _receiver(protocol) as rec:
        if isinstance(rec, HttpReceiver):
            rec.max_body_bytes = 4 * 1024 * 1024
        exporter = _exporter(_config(protocol, rec.port), tmp_path)
        Producer(exporter).submit([oversized.SerializeToString(), *requests[1:3]])
        assert exporter.flush(30)
        exporter.shutdown()
    assert _received(rec) == requests[1:3]
    assert exporter.counters.requests_dropped == 1
    messages = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(messages) == 1
    expected = "413" if protocol == "http/protobuf" else "RESOURCE_EXHAUSTED"
    assert expected in messages[0] and "dropped" in messages[0]
    assert exporter.spool.records() == []  # not spooled either: it would never be accepted
