"""OTLP/HTTP protobuf: one ``POST`` of pre-encoded ``ExportTraceServiceRequest`` bytes.

Status handling follows the OTLP specification: 2xx is success (with ``partial_success``
decoded), 429/502/503/504 are retryable (honouring ``Retry-After``), anything else is final;
error bodies are ``google.rpc.Status`` messages whose text is reported.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import socket
import ssl
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from .._version import __version__
from .config import ExporterConfig
from .result import ExportResult, server_delay

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
USER_AGENT = f"otelprof/{__version__}"


def ssl_context(cfg: ExporterConfig) -> ssl.SSLContext:
    """Verifies the receiver against ``certificate`` (else the system roots); presents the client
    certificate when one is configured (mutual TLS)."""
    context = ssl.create_default_context(cafile=cfg.certificate)
    if cfg.client_certificate:
        context.load_cert_chain(cfg.client_certificate, keyfile=cfg.client_key)
    return context


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: a number of seconds or an HTTP date, bounded
    (``server_delay``); None when absent or unreadable."""
    if not value:
        return None
    try:
        return server_delay(float(value))  # also "inf", "nan", "1e400", "-5"
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
        if when.tzinfo is None:  # "-0000": UTC by RFC 5322
            when = when.replace(tzinfo=timezone.utc)
        return server_delay((when - datetime.now(timezone.utc)).total_seconds())
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def _status_message(body: bytes) -> str:
    try:
        return str(Status.FromString(body).message)
    except DecodeError:
        return body[:200].decode("utf-8", "replace")


class HttpSender:
    """``send`` one request at a time; ``interrupt()`` (any thread) aborts the one in flight,
    which then ends as a retryable failure."""

    def __init__(self, cfg: ExporterConfig) -> None:
        self._cfg = cfg
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def send(self, request: bytes) -> ExportResult:
        return send(self._cfg, request, self._connected)

    def _connected(self, conn: http.client.HTTPConnection | None) -> None:
        with self._lock:
            self._conn = conn

    def interrupt(self) -> None:
        with self._lock:
            sock = self._conn.sock if self._conn is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        pass


def send(
    cfg: ExporterConfig,
    request: bytes,
    connected: Callable[[http.client.HTTPConnection | None], None] | None = None,
) -> ExportResult:
    """POSTs one request; never raises for network or protocol trouble (it becomes a result).
    ``connected`` is told the connection in use, then None."""
    url = urlsplit(cfg.url)
    body = gzip.compress(request, compresslevel=6) if cfg.compression == "gzip" else request
    headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT, **dict(cfg.headers)}
    if cfg.compression == "gzip":
        headers["Content-Encoding"] = "gzip"
    conn: http.client.HTTPConnection
    if url.scheme == "https":
        conn = http.client.HTTPSConnection(url.netloc, timeout=cfg.timeout_s, context=ssl_context(cfg))
    else:
        conn = http.client.HTTPConnection(url.netloc, timeout=cfg.timeout_s)
    try:
        if connected is not None:
            conn.connect()
            connected(conn)
        conn.request("POST", url.path or "/", body=body, headers=headers)
        response = conn.getresponse()
        payload = response.read()
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timeout, TLS failure
        return ExportResult(False, retryable=True, message=f"{type(exc).__name__}: {exc}")
    finally:
        if connected is not None:
            connected(None)
        conn.close()
    if 200 <= response.status < 300:
        try:
            partial = ExportTraceServiceResponse.FromString(payload).partial_success
        except DecodeError:
            return ExportResult.success()
        return ExportResult.success(partial.rejected_spans, partial.error_message)
    message = f"HTTP {response.status}: {_status_message(payload)}"
    if response.status in RETRYABLE_STATUS:
        return ExportResult(False, True, _retry_after(response.getheader("Retry-After")), message=message)
    return ExportResult(False, message=message)
