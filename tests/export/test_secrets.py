"""Secrets are never printed: URL user info is sent as HTTP Basic authentication (RFC 7617) to
real receivers, a header value that cannot be sent is refused when the configuration is read,
and a job's stderr at DEBUG shows neither, whatever hostile value it is given."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import transport

from .receivers import GrpcReceiver, HttpReceiver, grpc_receiver, http_receiver

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = ["http/protobuf", "grpc"]
USER = "us3r-t0ken"  # a token is often the user name
PASSWORD = "pa:ss-w0rd"
SECRETS = (USER, PASSWORD, "pa%3Ass-w0rd", "TOKSECRET")


def _basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def _request(name: str) -> bytes:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.trace_id, span.span_id = name, b"\1" * 16, b"\2" * 8
    return request.SerializeToString()


def _span_names(rec: HttpReceiver | GrpcReceiver) -> list[str]:
    return [s.name for r in rec.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _receiver(protocol: str, **required: str) -> AbstractContextManager[Any]:
    if protocol == "grpc":
        return grpc_receiver(GrpcReceiver(required_metadata=required))
    return http_receiver(HttpReceiver(required_headers=required))


def _seen(rec: HttpReceiver | GrpcReceiver) -> list[dict[str, str]]:
    return rec.metadata_seen if isinstance(rec, GrpcReceiver) else rec.headers_seen


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_url_credentials_arrive_as_basic_authentication(protocol: str) -> None:
    with _receiver(protocol, authorization=_basic(f"{USER}:{PASSWORD}"), **{"x-team": "ml"}) as rec:
        cfg = exporter_config_from_env(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}:pa%3Ass-w0rd@127.0.0.1:{rec.port}",
                "OTEL_EXPORTER_OTLP_HEADERS": "x-team=ml",
                "OTEL_EXPORTER_OTLP_TIMEOUT": "5000",
            }
        )
        send, close = transport(cfg)
        try:
            result = send(_request("with-basic-auth"))
        finally:
            close()
    assert result.ok, result.message
    assert _span_names(rec) == ["with-basic-auth"]
    assert [seen["authorization"] for seen in _seen(rec)] == [_basic("us3r-t0ken:pa:ss-w0rd")]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_user_name_alone_is_sent_with_an_empty_password(protocol: str) -> None:
    with _receiver(protocol, authorization=_basic(f"{USER}:")) as rec:
        cfg = exporter_config_from_env(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}@127.0.0.1:{rec.port}",
            }
        )
        send, close = transport(cfg)
        try:
            result = send(_request("token-as-user"))
        finally:
            close()
    assert result.ok, result.message
    assert _span_names(rec) == ["token-as-user"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("value", ["Bearer TOKSECRET%0D%0AX: y", "TOKSECRET%00", "TOKSECRET%C3%A9", "TOK%09SECRET"])
def test_a_header_that_cannot_be_sent_no_longer_fails_every_request(protocol: str, value: str) -> None:
    """Before, http.client raised ``ValueError('Invalid header value b'Bearer TOKSECRET\\r\\n...')``
    inside send() (a traceback with the token, nothing ever exported) and gRPC answered
    INTERNAL for every call; now the header is refused when the configuration is read."""
    with _receiver(protocol) as rec:
        cfg = exporter_config_from_env(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}",
                "OTEL_EXPORTER_OTLP_HEADERS": f"x-team=ml,x-api-key={value}",
            }
        )
        send, close = transport(cfg)
        try:
            result = send(_request("without-the-bad-header"))
        finally:
            close()
    assert result.ok, result.message
    assert _span_names(rec) == ["without-the-bad-header"]
    [seen] = _seen(rec)
    assert seen["x-team"] == "ml" and "x-api-key" not in seen


# --- a job: stderr at DEBUG ------------------------------------------------------------------

_JOB = """
import json, logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
from otelprof.export.exporter import Exporter
exporter = Exporter(max_attempts=2, backoff_s=0.01, max_backoff_s=0.05, probe_interval_s=0.05)
exporter.submit(bytes.fromhex(sys.argv[1]))
exporter.flush(15)
exporter.shutdown()
counters = exporter.counters
print(json.dumps({"exported": counters.requests_exported, "spooled": counters.requests_spooled}))
"""


def _job_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    return {**env, "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"), "OTEL_EXPORTER_OTLP_TIMEOUT": "5000", **variables}


def _assert_no_secret(tmp_path: Path, *texts: str) -> None:
    files = [p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*") if p.is_file()]
    for text in (*texts, *files):
        for secret in SECRETS:
            assert secret not in text, secret


@pytest.fixture
def running(request: pytest.FixtureRequest) -> Iterator[HttpReceiver | GrpcReceiver]:
    protocol, required = request.param
    with _receiver(protocol, **required) as rec:
        yield rec


CASES = {
    # name: (protocol, what the receiver requires, the variables (PORT: the receiver's), exported)
    "password in the URL": (
        "http/protobuf",
        {"authorization": _basic(f"{USER}:{PASSWORD}")},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}:pa%3Ass-w0rd@127.0.0.1:PORT"},
        True,
    ),
    "password in the URL, gRPC": (
        "grpc",
        {"authorization": _basic(f"{USER}:{PASSWORD}")},
        {
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}:pa%3Ass-w0rd@127.0.0.1:PORT",
        },
        True,
    ),
    "token as the user name": (
        "http/protobuf",
        {"authorization": _basic(f"{USER}:")},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}@127.0.0.1:PORT"},
        True,
    ),
    "CR/LF in a header value": (
        "http/protobuf",
        {"x-team": "ml"},
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:PORT",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-team=ml,authorization=Bearer TOKSECRET%0D%0AX: y",
        },
        True,
    ),
    "unparseable URL with a password": (
        "http/protobuf",
        {},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}:pa%3Ass-w0rd@[::1"},
        False,
    ),
}


@pytest.mark.parametrize(
    ("running", "case"), [((c[0], c[1]), name) for name, c in CASES.items()], indirect=["running"], ids=list(CASES)
)
def test_a_job_never_prints_a_secret(tmp_path: Path, running: HttpReceiver | GrpcReceiver, case: str) -> None:
    _, _, variables, exported = CASES[case]
    env = _job_env(tmp_path, **{k: v.replace("PORT", str(running.port)) for k, v in variables.items()})
    proc = subprocess.run(
        [sys.executable, "-c", _JOB, _request("from-a-job").hex()],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    _assert_no_secret(tmp_path, proc.stdout, proc.stderr)
    counts = json.loads(proc.stdout.splitlines()[-1])
    if exported:
        assert counts == {"exported": 1, "spooled": 0}, proc.stderr
        assert _span_names(running) == ["from-a-job"]
    else:
        assert counts == {"exported": 0, "spooled": 1}, proc.stderr
        warnings = [line for line in proc.stderr.splitlines() if "is not an http(s) URL" in line]
        assert warnings == [
            "WARNING:otelprof.export.config:OTEL_EXPORTER_OTLP_ENDPOINT='http://***@[::1' is not an http(s) URL;"
            " ignored: spans go to the spool, as with no endpoint"
        ]
    if case == "CR/LF in a header value":
        assert (
            "WARNING:otelprof.export.config:OTEL_EXPORTER_OTLP_HEADERS: header 'authorization' has a control or"
            " non-ASCII character in its value; skipped"
        ) in proc.stderr.splitlines()


_TRAINING = """
import logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
import torch, otelprof
otelprof.instrument()
model = torch.nn.Linear(4, 2)
for _ in range(3):
    with otelprof.step_scope():
        model(torch.ones(2, 4)).sum().backward()
otelprof.uninstrument()
"""


@pytest.mark.slow  # a torch training subprocess
@pytest.mark.parametrize("reachable", [True, False], ids=["credentials", "unparseable"])
def test_an_instrumented_training_job_never_prints_a_secret(tmp_path: Path, reachable: bool) -> None:
    """A tiny torch loop under otelprof.instrument(): its step spans reach the receiver with the
    URL's credentials (the hostile header skipped), or, for an endpoint urllib cannot parse,
    otelprof warns once and records to the spool instead of switching itself off."""
    pytest.importorskip("torch")
    with http_receiver(HttpReceiver(required_headers={"authorization": _basic(f"{USER}:{PASSWORD}")})) as rec:
        host = f"127.0.0.1:{rec.port}" if reachable else "[::1"
        env = _job_env(
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{USER}:pa%3Ass-w0rd@{host}",
            OTEL_EXPORTER_OTLP_HEADERS="x-api-key=TOKSECRET%0D%0AX: y",
            OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
            OTEL_EXPORTER_PROMETHEUS_PORT="0",
        )
        proc = subprocess.run(
            [sys.executable, "-c", _TRAINING], capture_output=True, text=True, env=env, timeout=300, check=False
        )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "could not start" not in proc.stderr, proc.stderr
    _assert_no_secret(tmp_path, proc.stdout, proc.stderr)
    if reachable:
        assert len(_span_names(rec)) >= 3, proc.stderr  # the steps, sent with the URL's credentials
        assert {seen["authorization"] for seen in rec.headers_seen} == {_basic(f"{USER}:{PASSWORD}")}
        assert not any("x-api-key" in seen for seen in rec.headers_seen)
    else:
        assert rec.requests == [] and list((tmp_path / "spool").glob("*.otlp*")), proc.stderr
        assert "'http://***@[::1' is not an http(s) URL" in proc.stderr
