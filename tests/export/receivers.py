"""In-process OTLP receivers on 127.0.0.1 speaking the official opentelemetry-proto messages."""

from __future__ import annotations

import gzip
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    rejected_spans: int = 0  # for 200: a partial_success
    message: str = ""


@dataclass
class HttpReceiver:
    """Decodes every request; answers from ``script`` in order, then 200."""

    port: int = 0
    required_headers: dict[str, str] = field(default_factory=dict)
    script: list[Reply] = field(default_factory=list)
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def spans(self) -> list[object]:
        return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def _handle(self, handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
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
        request = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            self.requests.append(request)
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
