"""In-process OTLP receivers on 127.0.0.1 speaking the official opentelemetry-proto messages."""

from __future__ import annotations

import gzip
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.rpc import error_details_pb2
from google.rpc.status_pb2 import Status
from grpc_status import rpc_status
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
    ExportProfilesServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    rejected_spans: int = 0  # for 200: a partial_success
    message: str = ""
    delay_s: float = 0.0  # for 200: keep the request, then answer this late (a slow backend)


@dataclass
class HttpReceiver:
    """Decodes every request; answers from ``script`` in order, then 200."""

    port: int = 0
    required_headers: dict[str, str] = field(default_factory=dict)
    script: list[Reply] = field(default_factory=list)
    max_body_bytes: int | None = None  # larger bodies get 413, as a size-limited collector answers
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    metric_requests: list[ExportMetricsServiceRequest] = field(default_factory=list)  # POST /v1/metrics
    profile_requests: list[ExportProfilesServiceRequest] = field(default_factory=list)  # /v1development/profiles
    paths: list[str] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def spans(self) -> list[Span]:
        return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def _handle(self, handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        if self.max_body_bytes is not None and len(body) > self.max_body_bytes:
            message = f"request body of {len(body)} bytes exceeds the limit of {self.max_body_bytes}"
            return 413, {}, Status(code=8, message=message).SerializeToString()
        headers = {k.lower(): v for k, v in handler.headers.items()}
        with self.lock:
            self.paths.append(handler.path)
            self.headers_seen.append(headers)
            for key, value in self.required_headers.items():
                if headers.get(key) != value:
                    return 401, {}, Status(code=16, message="missing or wrong credentials").SerializeToString()
            reply = self.script.pop(0) if self.script else Reply()
        if reply.status != 200:
            return reply.status, reply.headers, Status(code=14, message=reply.message).SerializeToString()
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if handler.path.endswith("/v1/metrics"):
            with self.lock:
                self.metric_requests.append(ExportMetricsServiceRequest.FromString(body))
            return 200, {}, ExportMetricsServiceResponse().SerializeToString()
        if handler.path.endswith("/v1development/profiles"):
            with self.lock:
                self.profile_requests.append(ExportProfilesServiceRequest.FromString(body))
            return 200, {}, ExportProfilesServiceResponse().SerializeToString()
        request = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            self.requests.append(request)
        time.sleep(reply.delay_s)
        response = ExportTraceServiceResponse()
        if reply.rejected_spans:
            response.partial_success.CopyFrom(
                ExportTracePartialSuccess(rejected_spans=reply.rejected_spans, error_message=reply.message)
            )
        return 200, {}, response.SerializeToString()


@contextmanager
def http_receiver(receiver: HttpReceiver | None = None, tls: ssl.SSLContext | None = None) -> Iterator[HttpReceiver]:
    """Serves ``receiver`` on 127.0.0.1 (HTTPS when ``tls`` is given) until the block ends."""
    rec = receiver or HttpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            status, headers, payload = rec._handle(self)
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", rec.port), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    rec.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class SlowHttpReceiver:
    """Keeps each request (decoded), then answers 200 in a way that costs the client: with
    ``drip_s``, the reply a byte at a time, this far apart (a socket timeout restarts with each
    byte); with ``body_bytes``, a body that long, streamed until the client stops reading. The
    first ``quick_replies`` are answered at once. ``bytes_sent``: what the sockets took of the
    replies; ``replies_ended``: replies over."""

    drip_s: float = 0.0
    body_bytes: int = 0
    quick_replies: int = 0
    port: int = 0
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    bytes_sent: int = 0
    replies_ended: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _reply(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        with self.lock:
            self.requests.append(ExportTraceServiceRequest.FromString(body))
            quick = len(self.requests) <= self.quick_replies
        length = 0 if quick else self.body_bytes  # an empty ExportTraceServiceResponse is 0 bytes
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: {length}\r\n\r\n"
        try:
            if self.drip_s and not quick:
                for byte in head.encode():
                    if self.stop.wait(self.drip_s):
                        return
                    self._write(handler, bytes([byte]))
            else:
                self._write(handler, head.encode())
                chunk = bytes(64 * 1024)
                for start in range(0, length, len(chunk)):
                    self._write(handler, chunk[: length - start])
        except OSError:  # the client closed: it read what it wanted
            pass
        finally:
            with self.lock:
                self.replies_ended += 1

    def _write(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.wfile.write(data)  # unbuffered: straight to the socket
        with self.lock:
            self.bytes_sent += len(data)


@contextmanager
def slow_http_receiver(receiver: SlowHttpReceiver) -> Iterator[SlowHttpReceiver]:
    """Serves ``receiver`` on 127.0.0.1 until the block ends (a dripping reply stops then)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            receiver._reply(self)
            self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            pass

    receiver.stop.clear()
    server = ThreadingHTTPServer(("127.0.0.1", receiver.port), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class GrpcReply:
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""
    retry_delay_s: float | None = None  # attach a google.rpc.RetryInfo
    rejected_spans: int = 0
    delay_s: float = 0.0  # for OK: keep the request, then answer this late (a slow backend)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    """The official OTLP trace service, answering from a script like HttpReceiver."""

    def __init__(self, rec: GrpcReceiver) -> None:
        self.rec = rec

    def Export(self, request: ExportTraceServiceRequest, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        metadata = dict(context.invocation_metadata())
        with self.rec.lock:
            self.rec.metadata_seen.append(metadata)
            for key, value in self.rec.required_metadata.items():
                if metadata.get(key) != value:
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong credentials")
            reply = self.rec.script.pop(0) if self.rec.script else GrpcReply()
        if reply.code != grpc.StatusCode.OK:
            status = Status(code=reply.code.value[0], message=reply.message)
            if reply.retry_delay_s is not None:
                info = error_details_pb2.RetryInfo()
                info.retry_delay.FromNanoseconds(int(reply.retry_delay_s * 1e9))
                status.details.add().Pack(info)
            context.abort_with_status(rpc_status.to_status(status))
        with self.rec.lock:
            self.rec.requests.append(request)
        self.rec.stop.wait(reply.delay_s)  # ends with the receiver: its pool threads are joined at exit
        response = ExportTraceServiceResponse()
        if reply.rejected_spans:
            response.partial_success.rejected_spans = reply.rejected_spans
            response.partial_success.error_message = reply.message
        return response


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    """The official OTLP metrics service: keeps every request."""

    def __init__(self, rec: GrpcReceiver) -> None:
        self.rec = rec

    def Export(
        self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext
    ) -> ExportMetricsServiceResponse:
        with self.rec.lock:
            self.rec.metric_requests.append(request)
        return ExportMetricsServiceResponse()


class _ProfilesService(profiles_service_pb2_grpc.ProfilesServiceServicer):
    """The official OTLP profiles service (v1development): keeps every request."""

    def __init__(self, rec: GrpcReceiver) -> None:
        self.rec = rec

    def Export(
        self, request: ExportProfilesServiceRequest, context: grpc.ServicerContext
    ) -> ExportProfilesServiceResponse:
        with self.rec.lock:
            self.rec.profile_requests.append(request)
        return ExportProfilesServiceResponse()


@dataclass
class GrpcReceiver:
    port: int = 0
    required_metadata: dict[str, str] = field(default_factory=dict)
    script: list[GrpcReply] = field(default_factory=list)
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    metadata_seen: list[dict[str, str]] = field(default_factory=list)
    metric_requests: list[ExportMetricsServiceRequest] = field(default_factory=list)
    profile_requests: list[ExportProfilesServiceRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)


@contextmanager
def grpc_receiver(
    receiver: GrpcReceiver | None = None, tls: grpc.ServerCredentials | None = None
) -> Iterator[GrpcReceiver]:
    """Serves the official OTLP TraceService on 127.0.0.1 until the block ends."""
    rec = receiver or GrpcReceiver()
    rec.stop.clear()  # a receiver served again
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(rec), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(rec), server)
    profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(_ProfilesService(rec), server)
    address = f"127.0.0.1:{rec.port}"
    rec.port = server.add_secure_port(address, tls) if tls else server.add_insecure_port(address)
    server.start()
    try:
        yield rec
    finally:
        rec.stop.set()
        server.stop(grace=None)


def free_port() -> int:
    """A port nothing listens on now (for a receiver that starts later, or never)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Polls ``predicate`` until it holds or ``timeout_s`` passes (the caller asserts after)."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
