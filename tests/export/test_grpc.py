"""OTLP/gRPC transport against the official TraceService running in-process."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from converter_helpers import shared_trace

from otelprof.converter import convert
from otelprof.export import exporter_config_from_env
from otelprof.export.grpc import GrpcSender

from .certs import make_pki
from .receivers import GrpcReceiver, GrpcReply, grpc_receiver


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    result = convert(shared_trace("amd_trace"), detail="full", max_request_bytes=16 * 1024)
    assert len(result.requests) > 1
    return result.requests


def _sender(port: int, **extra: str) -> GrpcSender:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", **extra}
    return GrpcSender(exporter_config_from_env(env))


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_every_span_arrives(requests: list[bytes], compression: str) -> None:
    with grpc_receiver() as rec:
        sender = _sender(rec.port, OTEL_EXPORTER_OTLP_COMPRESSION=compression)
        results = [sender.send(r) for r in requests]
        sender.close()
    assert all(r.ok for r in results), [r.message for r in results]
    assert [r.SerializeToString() for r in rec.requests] == requests


def test_auth_metadata_required_by_the_receiver(requests: list[bytes]) -> None:
    with grpc_receiver(GrpcReceiver(required_metadata={"authorization": "Bearer t0k"})) as rec:
        denied = _sender(rec.port).send(requests[0])
        allowed = _sender(rec.port, OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer%20t0k").send(requests[0])
    assert (denied.ok, denied.retryable) == (False, False)
    assert denied.message == "gRPC UNAUTHENTICATED: missing or wrong credentials"
    assert allowed.ok and len(rec.requests) == 1


@pytest.mark.parametrize(
    ("reply", "retryable", "delay"),
    [
        (GrpcReply(grpc.StatusCode.UNAVAILABLE, "restarting"), True, None),
        (GrpcReply(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", retry_delay_s=1.5), True, 1.5),
        (GrpcReply(grpc.StatusCode.RESOURCE_EXHAUSTED, "no retry info"), False, None),
        (GrpcReply(grpc.StatusCode.INVALID_ARGUMENT, "bad span"), False, None),
    ],
)
def test_status_codes_follow_the_specification(
    requests: list[bytes], reply: GrpcReply, retryable: bool, delay: float | None
) -> None:
    with grpc_receiver(GrpcReceiver(script=[reply])) as rec:
        sender = _sender(rec.port)
        first, second = sender.send(requests[0]), sender.send(requests[0])
        sender.close()
    assert (first.ok, first.retryable, first.retry_after_s) == (False, retryable, delay)
    assert first.message == f"gRPC {reply.code.name}: {reply.message}"
    assert second.ok and len(rec.requests) == 1


def test_partial_success_is_decoded(requests: list[bytes]) -> None:
    with grpc_receiver(GrpcReceiver(script=[GrpcReply(rejected_spans=3, message="too old")])) as rec:
        result = _sender(rec.port).send(requests[0])
    assert (result.ok, result.rejected_spans, result.message) == (True, 3, "too old")


def test_receiver_down_is_retryable_not_raised(requests: list[bytes]) -> None:
    with grpc_receiver() as rec:
        port = rec.port
    result = _sender(port, OTEL_EXPORTER_OTLP_TIMEOUT="2000").send(requests[0])
    assert (result.ok, result.retryable) == (False, True)


def test_tls_with_a_test_ca_and_a_required_client_certificate(requests: list[bytes], tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    server_creds = grpc.ssl_server_credentials(
        [(pki.server_key.read_bytes(), pki.server_cert.read_bytes())],
        root_certificates=pki.ca.read_bytes(),
        require_client_auth=True,
    )
    with grpc_receiver(tls=server_creds) as rec:
        base = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rec.port}",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(pki.ca),
        }
        without_client_cert = _sender(rec.port, **{**base, "OTEL_EXPORTER_OTLP_TIMEOUT": "3000"}).send(requests[0])
        with_client_cert = _sender(
            rec.port,
            **base,
            OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE=str(pki.client_cert),
            OTEL_EXPORTER_OTLP_CLIENT_KEY=str(pki.client_key),
        ).send(requests[0])
    assert not without_client_cert.ok
    assert with_client_cert.ok, with_client_cert.message
    assert len(rec.requests) == 1
