"""Deadlines and bounds against real receivers on 127.0.0.1 that answer slowly or at length.

One deadline per request (``OTEL_EXPORTER_OTLP_TIMEOUT``) for connect, send and the whole
reply, however slowly the reply trickles in; a reply body read no further than a small cap; and
one deadline for ``Exporter.shutdown`` in all, at which the request in flight is interrupted
and spooled with everything still queued: each request submitted ends exactly once as
exported, spooled or dropped.
"""

from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import shared_trace
from prometheus_client import CollectorRegistry

from otelprof.converter import convert
from otelprof.export import ExporterConfig, exporter_config_from_env
from otelprof.export.exporter import Exporter
from otelprof.export.http import MAX_REPLY_BYTES, send
from otelprof.export.overflow import OverflowWriter

from .receivers import GrpcReceiver, GrpcReply, SlowHttpReceiver, grpc_receiver, slow_http_receiver, wait_until

#: Generous: the machine is shared; only a wait outside the deadline takes this long.
SLACK_S = 3.0


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    return convert(shared_trace("critical_path"), detail="full", max_request_bytes=8 * 1024).requests[:10]


def _config(port: int, protocol: str = "http/protobuf", timeout_ms: int = 10_000) -> ExporterConfig:
    return exporter_config_from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": str(timeout_ms),
        }
    )


def test_a_reply_dripping_a_byte_at_a_time_ends_at_the_request_deadline(requests: list[bytes]) -> None:
    # 76 bytes of headers at 0.5 s each: 38 s, though no single read ever waits 1.5 s
    with slow_http_receiver(SlowHttpReceiver(drip_s=0.5)) as rec:
        start = time.monotonic()
        result = send(_config(rec.port, timeout_ms=1500), requests[0])
        elapsed = time.monotonic() - start
    assert (result.ok, result.retryable) == (False, True)
    assert result.message.startswith("TimeoutError"), result.message
    assert [r.SerializeToString() for r in rec.requests] == requests[:1]  # it arrived; the reply never did
    assert elapsed < 1.5 + SLACK_S


def test_a_huge_reply_body_is_read_no_further_than_the_cap(requests: list[bytes]) -> None:
    body = 256 << 20
    with slow_http_receiver(SlowHttpReceiver(body_bytes=body)) as rec:
        result = send(_config(rec.port), requests[0])
        wait_until(lambda: rec.replies_ended == 1, 10)
    assert result.ok and result.rejected_spans == 0  # a 2xx: accepted, however long its body
    assert [r.SerializeToString() for r in rec.requests] == requests[:1]
    # the client read 64 KiB and closed: the rest stopped at the sockets' buffers (a few MiB)
    assert MAX_REPLY_BYTES == 64 * 1024
    assert rec.replies_ended == 1 and rec.bytes_sent < body // 4


def _http_stalling_after(quick: int) -> AbstractContextManager[Any]:
    return slow_http_receiver(SlowHttpReceiver(drip_s=0.5, quick_replies=quick))


def _grpc_stalling_after(quick: int) -> AbstractContextManager[Any]:
    return grpc_receiver(GrpcReceiver(script=[GrpcReply()] * quick + [GrpcReply(delay_s=30.0)]))


@pytest.mark.parametrize(
    ("protocol", "receiver"),
    [("http/protobuf", _http_stalling_after), ("grpc", _grpc_stalling_after)],
    ids=["http-drip", "grpc-stall"],
)
def test_shutdown_keeps_one_deadline_and_spools_the_request_in_flight(
    protocol: str, receiver: Any, tmp_path: Path, requests: list[bytes]
) -> None:
    quick = 3
    with receiver(quick) as rec:
        exporter = Exporter(_config(rec.port, protocol), spool_dir=tmp_path, registry=CollectorRegistry())
        for r in requests:
            exporter.submit(r)
        # three answered, the fourth held by the receiver (its answer 38 s or 30 s away)
        wait_until(lambda: exporter.counters.requests_exported == quick and len(rec.requests) == quick + 1)
        start = time.monotonic()
        exporter.shutdown(timeout_s=2.0)  # the request timeout is 10 s: the exit deadline wins
        elapsed = time.monotonic() - start
        exporter.shutdown(timeout_s=2.0)  # idempotent: nothing counted or spooled twice
    counters = exporter.counters
    spooled = [data for _path, data in exporter.spool]
    assert elapsed < 2.0 + SLACK_S
    # every request submitted ends exactly once: exported, spooled or dropped
    assert (counters.requests_exported, counters.requests_spooled, counters.requests_dropped) == (3, 7, 0)
    assert counters.requests_exported + counters.requests_spooled + counters.requests_dropped == len(requests)
    assert [r.SerializeToString() for r in rec.requests] == requests[: quick + 1]
    # the one in flight first (it also reached the receiver: at least once), then the queue
    assert spooled == requests[quick:]


def test_the_spool_writer_hands_back_what_it_did_not_write_by_its_deadline() -> None:
    writing, release = threading.Event(), threading.Event()
    written: list[bytes] = []

    def slow_write(request: bytes) -> None:  # a disk that stalls on the first fsync
        writing.set()
        release.wait(10)
        written.append(request)

    writer = OverflowWriter(slow_write, 1 << 20)
    assert all(writer.put(r) for r in (b"a", b"b", b"c"))
    assert writing.wait(10)
    left = writer.close(0.2)
    release.set()
    assert writer._thread is not None
    writer._thread.join(10)
    assert (written, left) == ([b"a"], [b"b", b"c"])  # each once: written, or the caller's to spool
    assert not writer.put(b"d")  # closed
