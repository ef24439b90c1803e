"""OTLP/gRPC: ``TraceService/Export`` with pre-encoded ``ExportTraceServiceRequest`` bytes.

Status handling follows the OTLP specification: CANCELLED, DEADLINE_EXCEEDED, ABORTED,
OUT_OF_RANGE, UNAVAILABLE and DATA_LOSS are retryable; RESOURCE_EXHAUSTED only when the server
sends a ``RetryInfo`` (whose delay is honoured); everything else is final.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from .._version import __version__
from .config import ExporterConfig
from .http import TlsConfigError, ssl_context
from .result import TLS, TLS_CONFIG, ExportResult, server_delay

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
#: ExportProfilesServiceResponse has ExportTraceServiceResponse's fields and numbers (a partial
#: success: a count, a message), so one response class reads both.
PROFILES_METHOD = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
#: Collector-sized messages: otelprof's requests stay under 4 MiB, responses are tiny. The
#: reconnect backoff is capped (gRPC's default grows to 120 s) so a restarted backend is found
#: by the exporter's next probe rather than minutes later.
_CHANNEL_OPTIONS = [
    ("grpc.primary_user_agent", f"otelprof/{__version__}"),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 5000),
]


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _credentials(cfg: ExporterConfig) -> grpc.ChannelCredentials:
    """The TLS files, checked first: gRPC takes any bytes and fails each call with "Failed to
    create security handshaker", naming neither the variable nor TLS."""
    if cfg.certificate or cfg.client_key or cfg.client_certificate:
        ssl_context(cfg)  # raises TlsConfigError, naming the variable
    try:
        return grpc.ssl_channel_credentials(
            _read(cfg.certificate), _read(cfg.client_key), _read(cfg.client_certificate)
        )
    except (OSError, ValueError) as exc:  # removed or unreadable since the check
        raise TlsConfigError(f"TLS configuration error: cannot use the TLS files: {exc}") from None


def _tls_hint(cfg: ExporterConfig, details: str) -> str:
    """What a failed TLS handshake most likely means."""
    text = details.upper()
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "the receiver's certificate is not trusted: set OTEL_EXPORTER_OTLP_CERTIFICATE to its CA (PEM)"
    if "CERTIFICATE_REQUIRED" in text:
        return "the receiver wants a client certificate: set OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY"
    return f"does {cfg.target} speak gRPC without TLS? then use an http:// endpoint"


def _retry_delay(error: grpc.RpcError) -> float | None:
    """The ``RetryInfo`` delay from the status details the server attached, if any."""
    for key, value in error.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:
            return None
        for detail in status.details:
            info = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                return server_delay(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


class GrpcSender:
    """One channel per configuration, created lazily; ``send`` never raises for RPC or TLS
    trouble. gRPC's deadline (``timeout_s``) covers the whole call, connecting included: a call
    waits for a connection being made only until then (and fails at once on a channel that
    could not connect)."""

    def __init__(self, cfg: ExporterConfig) -> None:
        self._cfg = cfg
        self._channel: grpc.Channel | None = None
        self._export: grpc.UnaryUnaryMultiCallable | None = None
        self._call: grpc.Future | None = None  # the call in flight

    def _stub(self) -> grpc.UnaryUnaryMultiCallable:
        if self._export is None:
            cfg = self._cfg
            if cfg.insecure:
                self._channel = grpc.insecure_channel(cfg.target, options=_CHANNEL_OPTIONS)
            else:  # checked on each send until they are usable: a fixed file is picked up
                self._channel = grpc.secure_channel(cfg.target, _credentials(cfg), options=_CHANNEL_OPTIONS)
            self._export = self._channel.unary_unary(
                PROFILES_METHOD if cfg.signal == "profiles" else EXPORT_METHOD,
                request_serializer=lambda data: data,  # already an encoded ExportTraceServiceRequest
                response_deserializer=ExportTraceServiceResponse.FromString,
            )
        return self._export

    def send(self, request: bytes) -> ExportResult:
        cfg = self._cfg
        compression = grpc.Compression.Gzip if cfg.compression == "gzip" else grpc.Compression.NoCompression
        try:
            call = self._stub().future(
                request, timeout=cfg.timeout_s, metadata=list(cfg.headers), compression=compression
            )
            self._call = call
            try:
                response = call.result()
            finally:
                self._call = None
        except TlsConfigError as exc:
            return ExportResult(False, True, message=str(exc), problem=TLS_CONFIG)
        except grpc.FutureCancelledError:
            return ExportResult(False, True, message="gRPC CANCELLED: interrupted")
        except grpc.RpcError as error:
            code: grpc.StatusCode = error.code()
            details = str(error.details())
            message = f"gRPC {code.name}: {details}"
            if "handshake failed" in details.lower():  # gRPC's words for a TLS handshake failure
                return ExportResult(
                    False, True, message=f"TLS handshake failed ({message}): {_tls_hint(cfg, details)}", problem=TLS
                )
            delay = _retry_delay(error)
            if code in RETRYABLE_CODES:
                return ExportResult(False, True, delay, message=message)
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None:
                return ExportResult(False, True, delay, message=message)
            return ExportResult(False, message=message)
        partial = response.partial_success
        return ExportResult.success(partial.rejected_spans, partial.error_message)

    def interrupt(self) -> None:
        """Cancels the call in flight (any thread): it ends as a retryable failure."""
        call = self._call
        if call is not None:
            call.cancel()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._export = None
