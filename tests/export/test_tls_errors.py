"""TLS problems named as TLS problems, over both protocols, against real receivers on 127.0.0.1.

An unusable TLS file is a configuration error: one warning naming the variable, no traceback,
every request spooled (never sent or retried in vain) and sent by a later run whose file is
fixed. An ``https://`` endpoint whose port speaks plain HTTP (or gRPC without TLS): one warning
that the TLS handshake failed, suggesting ``http://``.
"""

from __future__ import annotations

import ssl
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import grpc
import pytest
from converter_helpers import shared_trace
from prometheus_client import CollectorRegistry

from otelprof.converter import convert
from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import Exporter

from .certs import LoopbackPki, make_pki
from .receivers import grpc_receiver, http_receiver, wait_until

PROTOCOLS = ["http/protobuf", "grpc"]


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    return convert(shared_trace("critical_path"), detail="full", max_request_bytes=8 * 1024).requests[:3]


def _tls_receiver(protocol: str, pki: LoopbackPki) -> AbstractContextManager[Any]:
    if protocol == "grpc":
        creds = grpc.ssl_server_credentials([(pki.server_key.read_bytes(), pki.server_cert.read_bytes())])
        return grpc_receiver(tls=creds)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    return http_receiver(tls=context)


def _exporter(env: dict[str, str], spool_dir: Path) -> Exporter:
    return Exporter(
        exporter_config_from_env(env),
        spool_dir=spool_dir,
        registry=CollectorRegistry(),
        backoff_s=0.01,
        max_backoff_s=0.05,
        probe_interval_s=0.05,
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"])
def test_an_unusable_tls_file_is_named_once_and_spooled_until_fixed(
    protocol: str, variable: str, tmp_path: Path, requests: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    pki = make_pki(tmp_path)
    not_pem = tmp_path / "not-a-certificate.pem"
    not_pem.write_text("this is not a certificate\n")
    spool = tmp_path / "spool"
    with _tls_receiver(protocol, pki) as rec:
        fixed = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rec.port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(pki.ca),
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(pki.client_cert),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(pki.client_key),
        }
        broken = _exporter({**fixed, variable: str(not_pem)}, spool)
        for r in requests:
            broken.submit(r)
        assert broken.flush(30)
        broken.shutdown()
        counters = broken.counters
        assert (counters.requests_exported, counters.requests_spooled, counters.requests_dropped) == (0, 3, 0)
        assert counters.worker_errors == 0 and rec.requests == []
        tls = [r for r in caplog.records if "TLS configuration error" in r.getMessage()]
        assert len(tls) == 1, [r.getMessage() for r in caplog.records]  # once, though probed again and again
        assert f"{variable}={not_pem}" in tls[0].getMessage()
        assert tls[0].levelname == "WARNING" and not tls[0].exc_info  # one line, no traceback
        assert len([r for r in caplog.records if r.name.startswith("otelprof.export")]) == 1  # the only one
        later = _exporter(fixed, spool)  # a later run, its file fixed: sends what was spooled
        wait_until(lambda: len(rec.requests) == len(requests))
        later.shutdown()
    assert [r.SerializeToString() for r in rec.requests] == requests
    assert later.counters.requests_replayed == len(requests) and later.spool.records() == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_https_at_a_plain_port_says_the_tls_handshake_failed(
    protocol: str, tmp_path: Path, requests: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    with grpc_receiver() if protocol == "grpc" else http_receiver() as rec:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rec.port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2000",  # a plain HTTP server may wait for a line end
        }
        exporter = Exporter(
            exporter_config_from_env(env), spool_dir=tmp_path, registry=CollectorRegistry(), max_attempts=1
        )
        exporter.submit(requests[0])
        assert exporter.flush(30)
        exporter.shutdown()
    handshake = [r.getMessage() for r in caplog.records if "TLS handshake" in r.getMessage()]
    assert len(handshake) == 1, [r.getMessage() for r in caplog.records]
    assert f"127.0.0.1:{rec.port}" in handshake[0] and "use an http:// endpoint" in handshake[0]
    assert exporter.counters.requests_spooled == 1 and exporter.counters.worker_errors == 0
    assert rec.requests == []
