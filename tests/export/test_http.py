"""OTLP/HTTP transport against a real in-process receiver decoding the official messages."""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path

import pytest
from converter_helpers import shared_trace

from otelprof.converter import convert
from otelprof.export import exporter_config_from_env
from otelprof.export.http import send

from .certs import make_pki
from .receivers import HttpReceiver, Reply, http_receiver


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    result = convert(shared_trace("amd_trace"), detail="full", max_request_bytes=16 * 1024)
    assert len(result.requests) > 1
    return result.requests


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_every_span_arrives(requests: list[bytes], compression: str) -> None:
    with http_receiver() as rec:
        cfg = exporter_config_from_env(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}",
                "OTEL_EXPORTER_OTLP_COMPRESSION": compression,
            }
        )
        results = [send(cfg, r) for r in requests]
    assert all(r.ok for r in results)
    assert rec.paths == ["/v1/traces"] * len(requests)
    assert [r.SerializeToString() for r in rec.requests] == requests  # decoded, re-encoded: identical
    assert all(h.get("content-encoding") == ("gzip" if compression == "gzip" else None) for h in rec.headers_seen)


def test_auth_header_required_by_the_receiver(requests: list[bytes]) -> None:
    with http_receiver(HttpReceiver(required_headers={"authorization": "Bearer t0k"})) as rec:
        base = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{rec.port}/v1/traces"}
        denied = send(exporter_config_from_env(base), requests[0])
        allowed = send(
            exporter_config_from_env({**base, "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20t0k"}), requests[0]
        )
    assert (denied.ok, denied.retryable) == (False, False)
    assert denied.message == "HTTP 401: missing or wrong credentials"
    assert allowed.ok and len(rec.requests) == 1


@pytest.mark.parametrize(("status", "retry_after"), [(429, "3"), (503, None), (502, None), (504, "0")])
def test_retryable_statuses_honour_retry_after(requests: list[bytes], status: int, retry_after: str | None) -> None:
    headers = {"Retry-After": retry_after} if retry_after else {}
    with http_receiver(HttpReceiver(script=[Reply(status, headers, message="busy")])) as rec:
        cfg = exporter_config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}"})
        first, second = send(cfg, requests[0]), send(cfg, requests[0])
    assert (first.ok, first.retryable, first.message) == (False, True, f"HTTP {status}: busy")
    assert first.retry_after_s == (float(retry_after) if retry_after else None)
    assert second.ok and len(rec.requests) == 1


def test_non_retryable_status_reports_the_backend_message(requests: list[bytes]) -> None:
    with http_receiver(HttpReceiver(script=[Reply(400, message="bad span")])) as rec:
        cfg = exporter_config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}"})
        result = send(cfg, requests[0])
    assert (result.ok, result.retryable, result.message) == (False, False, "HTTP 400: bad span")


def test_partial_success_is_decoded(requests: list[bytes]) -> None:
    with http_receiver(HttpReceiver(script=[Reply(rejected_spans=2, message="too old")])) as rec:
        cfg = exporter_config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}"})
        result = send(cfg, requests[0])
    assert (result.ok, result.rejected_spans, result.message) == (True, 2, "too old")


def test_receiver_down_is_retryable_not_raised(requests: list[bytes]) -> None:
    with http_receiver() as rec:
        port = rec.port
    cfg = exporter_config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
    result = send(dataclasses.replace(cfg, timeout_s=2.0), requests[0])
    assert (result.ok, result.retryable) == (False, True)
    assert "Connection" in result.message or "refused" in result.message.lower()


def test_tls_with_a_test_ca_and_a_required_client_certificate(requests: list[bytes], tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    server_tls.load_cert_chain(pki.server_cert, pki.server_key)
    server_tls.verify_mode = ssl.CERT_REQUIRED  # the receiver insists on a client certificate
    with http_receiver(tls=server_tls) as rec:
        base = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rec.port}",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(pki.ca),
        }
        without_client_cert = send(exporter_config_from_env(base), requests[0])
        with_client_cert = send(
            exporter_config_from_env(
                {
                    **base,
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(pki.client_cert),
                    "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(pki.client_key),
                }
            ),
            requests[0],
        )
        untrusted = send(
            exporter_config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": base["OTEL_EXPORTER_OTLP_ENDPOINT"]}), requests[0]
        )
    assert not without_client_cert.ok
    assert with_client_cert.ok, with_client_cert.message
    assert not untrusted.ok and "CERTIFICATE_VERIFY_FAILED" in untrusted.message
    assert len(rec.requests) == 1
