"""OTLP/HTTP protobuf: one ``POST`` of pre-encoded ``ExportTraceServiceRequest`` bytes.

Status handling follows the OTLP specification: 2xx is success (with ``partial_success``
decoded), 429/502/503/504 are retryable (honouring ``Retry-After``), anything else is final;
error bodies are ``google.rpc.Status`` messages whose text is reported.

Each request has one deadline, ``timeout_s`` (``OTEL_EXPORTER_OTLP_TIMEOUT``), for everything:
connect, TLS handshake, sending and the whole reply. Every blocking socket call gets the time
left as its timeout, so a receiver that answers a byte at a time cannot stretch it (a plain
socket timeout restarts with each byte). A reply body is read up to ``MAX_REPLY_BYTES``.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import io
import os
import socket
import ssl
import threading
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from .._version import __version__
from ..settings import variables as ev
from .config import ExporterConfig
from .result import TLS, TLS_CONFIG, ExportResult, server_delay

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
USER_AGENT = f"otelprof/{__version__}"
#: The most of a reply body read. An ``ExportTraceServiceResponse`` or ``google.rpc.Status`` is
#: a few hundred bytes; past this the rest is left unread and the connection closed, so memory
#: stays flat whatever a receiver sends. A 2xx reply is a success however long its body (the
#: request was accepted); a ``partial_success`` is decoded only from a body within the cap.
MAX_REPLY_BYTES = 64 * 1024
_SEND_CHUNK = 64 * 1024  # each chunk of a request body gets the time left as its timeout


class TlsConfigError(Exception):
    """A TLS file the configuration names cannot be used: no send succeeds until it is fixed."""


def _variable(general: str, specific: str) -> str:
    """The variable that set a TLS file (the ``TRACES_`` one wins when set), for messages."""
    return specific if os.environ.get(specific, "").strip() else general


def ssl_context(cfg: ExporterConfig) -> ssl.SSLContext:
    """Verifies the receiver against ``certificate`` (else the system roots); presents the client
    certificate when one is configured (mutual TLS). Raises :class:`TlsConfigError`, naming the
    variable, for a file that is unreadable or not what it should be."""
    try:
        context = ssl.create_default_context(cafile=cfg.certificate)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        name = _variable(ev.OTEL_EXPORTER_OTLP_CERTIFICATE, ev.OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE)
        what = f"{name}={cfg.certificate}" if cfg.certificate else "the system's CA certificates"
        raise TlsConfigError(
            f"TLS configuration error: {what} is not a usable CA certificate file (PEM): {exc}"
        ) from None
    key = _variable(ev.OTEL_EXPORTER_OTLP_CLIENT_KEY, ev.OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY)
    cert = _variable(ev.OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, ev.OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE)
    if cfg.client_key and not cfg.client_certificate:
        raise TlsConfigError(f"TLS configuration error: {key} is set without {cert} (mutual TLS needs both)")
    if cfg.client_certificate:
        try:
            context.load_cert_chain(cfg.client_certificate, keyfile=cfg.client_key)
        except (OSError, ValueError) as exc:
            files = f"{cert}={cfg.client_certificate}" + (f", {key}={cfg.client_key}" if cfg.client_key else "")
            raise TlsConfigError(
                f"TLS configuration error: {files}: not a usable client certificate and key: {exc}"
            ) from None
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


def _shut(sock: socket.socket) -> None:
    """Wakes whatever blocks on ``sock`` (any thread). The plain socket's shutdown, also for TLS:
    ``SSLSocket.shutdown`` unwraps the connection under a thread that may be reading it."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Call:
    """One request's deadline and socket; ``cancel()`` (any thread) ends it at once."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def left(self) -> float:
        """Seconds until the deadline; raises once it has passed or the call was cancelled."""
        if self._cancelled:
            raise ConnectionAbortedError("interrupted")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out: no complete answer within {self.timeout_s:g} s")
        return left

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self._cancelled:
                _shut(sock)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._sock is not None:
                _shut(self._sock)

    def close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


class _Reader(io.RawIOBase):
    """The reply stream: each receive waits no longer than the deadline."""

    def __init__(self, sock: socket.socket, call: Call) -> None:
        self._sock = sock
        self._call = call

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        self._sock.settimeout(self._call.left())
        return self._sock.recv_into(buffer)


class _Bounded:
    """The connected socket as http.client uses it (``sendall``, ``makefile``, ``close``), every
    blocking call bounded by the call's deadline. ``close`` is the call's: http.client closes
    its socket after the headers of a ``Connection: close`` reply, before the body is read."""

    def __init__(self, sock: socket.socket, call: Call) -> None:
        self._sock = sock
        self._call = call

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), _SEND_CHUNK):
            self._sock.settimeout(self._call.left())
            self._sock.sendall(view[start : start + _SEND_CHUNK])

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_Reader(self._sock, self._call))

    def close(self) -> None:
        pass


class _HandshakeError(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class _Connection(http.client.HTTPConnection):
    """http.client's connection over sockets bounded by ``call``: connect, TLS handshake (when
    ``context`` is given), request and reply share one deadline."""

    def __init__(self, host: str, port: int, call: Call, context: ssl.SSLContext | None) -> None:
        self.default_port = 443 if context is not None else 80  # the Host header omits it
        super().__init__(host, port, timeout=call.timeout_s)
        self._call = call
        self._context = context

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self._call.left())
        self._call.attach(raw)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock: socket.socket = raw
        if self._context is not None:
            try:
                sock = self._context.wrap_socket(raw, server_hostname=self.host, do_handshake_on_connect=False)
                self._call.attach(sock)  # the descriptor moved to the TLS socket
                sock.settimeout(self._call.left())
                sock.do_handshake()  # one deadline for the whole handshake (CPython's ssl)
            except (OSError, ValueError) as exc:
                raise _HandshakeError(exc) from exc
        self.sock = _Bounded(sock, self._call)


def _tls_failure(url: str, exc: BaseException, handshake: bool) -> ExportResult:
    """A TLS failure, named as one, with what it most likely means. After the handshake only a
    certificate alert is one (TLS 1.3 refuses a missing client certificate then); any other
    error there is the connection's."""
    where = urlsplit(url).netloc
    cause = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = "the receiver's certificate is not trusted: set OTEL_EXPORTER_OTLP_CERTIFICATE to its CA (PEM)"
    elif "CERTIFICATE" in str(exc).upper():
        hint = "the receiver refused the client certificate (or wants one): check OTEL_EXPORTER_OTLP_CLIENT_*"
    elif handshake:
        hint = f"does {where} speak plain HTTP? then use an http:// endpoint"
    else:
        return ExportResult(False, retryable=True, message=cause)
    what = "TLS handshake" if handshake else "TLS session"
    return ExportResult(False, retryable=True, message=f"{what} with {where} failed ({cause}): {hint}", problem=TLS)


class HttpSender:
    """``send`` one request at a time; ``interrupt()`` (any thread) aborts the one in flight,
    which then ends as a retryable failure."""

    def __init__(self, cfg: ExporterConfig) -> None:
        self._cfg = cfg
        self._lock = threading.Lock()
        self._call: Call | None = None
        # loading CA certificates takes milliseconds: once per sender, once they load (a file
        # fixed later is read again by the next send until then)
        self._context: ssl.SSLContext | None = None

    def send(self, request: bytes) -> ExportResult:
        call = Call(self._cfg.timeout_s)
        with self._lock:
            self._call = call
        try:
            if self._context is None and urlsplit(self._cfg.url).scheme == "https":
                try:
                    self._context = ssl_context(self._cfg)
                except TlsConfigError as exc:
                    return ExportResult(False, retryable=True, message=str(exc), problem=TLS_CONFIG)
            return send(self._cfg, request, call, self._context)
        finally:
            with self._lock:
                self._call = None

    def interrupt(self) -> None:
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def close(self) -> None:
        pass


def send(
    cfg: ExporterConfig, request: bytes, call: Call | None = None, context: ssl.SSLContext | None = None
) -> ExportResult:
    """POSTs one request within ``cfg.timeout_s`` in all; never raises for network, TLS or
    protocol trouble (it becomes a result). ``call``: to cancel it from another thread;
    ``context``: the TLS context to use (else made from ``cfg``)."""
    call = call or Call(cfg.timeout_s)
    url = urlsplit(cfg.url)
    body = gzip.compress(request, compresslevel=6) if cfg.compression == "gzip" else request
    headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT, **dict(cfg.headers)}
    if cfg.compression == "gzip":
        headers["Content-Encoding"] = "gzip"
    tls = url.scheme == "https"
    try:
        if tls and context is None:
            context = ssl_context(cfg)
    except TlsConfigError as exc:
        return ExportResult(False, retryable=True, message=str(exc), problem=TLS_CONFIG)
    try:
        conn = _Connection(url.hostname or "", url.port or (443 if tls else 80), call, context if tls else None)
        conn.request("POST", url.path or "/", body=body, headers=headers)
        response = conn.getresponse()
        payload = response.read(MAX_REPLY_BYTES + 1)  # never the whole of a huge body
    except Exception as exc:
        if call.cancelled:  # interrupt(): whatever the socket said then
            return ExportResult(False, retryable=True, message="ConnectionAbortedError: interrupted")
        if isinstance(exc, _HandshakeError):
            return _tls_failure(cfg.url, exc.cause, handshake=True)
        if isinstance(exc, ssl.SSLError):
            return _tls_failure(cfg.url, exc, handshake=False)
        if isinstance(exc, (OSError, ValueError, http.client.HTTPException)):  # refused, reset, deadline
            return ExportResult(False, retryable=True, message=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        call.close()
    complete = len(payload) <= MAX_REPLY_BYTES
    if 200 <= response.status < 300:
        if not complete:  # accepted; a reply this long is no ExportTraceServiceResponse
            return ExportResult.success()
        try:
            partial = ExportTraceServiceResponse.FromString(payload).partial_success
        except DecodeError:
            return ExportResult.success()
        return ExportResult.success(partial.rejected_spans, partial.error_message)
    message = f"HTTP {response.status}: {_status_message(payload[:MAX_REPLY_BYTES])}"
    if not complete:
        message += f" (reply body cut at {MAX_REPLY_BYTES} bytes)"
    if response.status in RETRYABLE_STATUS:
        return ExportResult(False, True, _retry_after(response.getheader("Retry-After")), message=message)
    return ExportResult(False, message=message)
