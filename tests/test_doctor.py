"""``otelprof doctor`` against real receivers: healthy, down, TLS-only, and refusing credentials,
over OTLP/HTTP and OTLP/gRPC; the metrics port, the configuration, the spool, torch."""

from __future__ import annotations

import base64
import errno
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from export import certs
from export.receivers import GrpcReceiver, HttpReceiver, free_port, grpc_receiver, http_receiver
from prometheus_client import CollectorRegistry, Counter, start_http_server

from otelprof.cli import main
from otelprof.export.spool import Spool
from otelprof.settings import quoted

REPO_ROOT = Path(__file__).resolve().parents[1]
SECRET = "Bearer s3cr3t-t0ken"
PROTOCOLS = ["http/protobuf", "grpc"]


@pytest.fixture
def env(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A clean environment with an empty spool and a free metrics port."""
    clean_env.setenv("OTELPROF_SPOOL_DIR", str(tmp_path / "spool"))
    clean_env.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    clean_env.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(free_port()))
    return clean_env


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.LoopbackPki:
    return certs.make_pki(tmp_path_factory.mktemp("pki"))


def _doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, list[tuple[str, str]]], str]:
    """Exit code, the check lines by name as (status, message), and all output."""
    code = main(["doctor", "--no-torch", "--timeout", "5", *argv])
    captured = capsys.readouterr()
    checks: dict[str, list[tuple[str, str]]] = {}
    for line in captured.out.splitlines():
        if line.startswith("["):
            label, _, rest = line.partition("] ")
            name, _, message = rest.partition(": ")
            checks.setdefault(name, []).append((label.strip("[ ").lower(), message))
    return code, checks, captured.out + captured.err


def _receiver(protocol: str, tls: Any = None, **required: str) -> AbstractContextManager[Any]:
    if protocol == "grpc":
        return grpc_receiver(GrpcReceiver(required_metadata=required), tls=tls)
    return http_receiver(HttpReceiver(required_headers=required), tls=tls)


def _server_tls(protocol: str, pki: certs.LoopbackPki) -> Any:
    if protocol == "grpc":
        return grpc.ssl_server_credentials([(pki.server_key.read_bytes(), pki.server_cert.read_bytes())])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    return context


def _point_at(env: pytest.MonkeyPatch, protocol: str, url: str) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)


# --- the export check --------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_healthy_receiver_passes(protocol: str, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with _receiver(protocol) as rec:
        _point_at(env, protocol, f"http://127.0.0.1:{rec.port}")
        code, checks, out = _doctor(capsys)
    assert code == 0, out
    [(status, message)] = checks["export"]
    assert status == "ok" and "accepted an empty export" in message and message.startswith(protocol)
    assert len(rec.requests) == 1 and not rec.requests[0].resource_spans, "one real, empty Export call"
    assert {name: [s for s, _ in lines] for name, lines in checks.items()} == {
        "config": ["ok"],
        "export": ["ok"],
        "prometheus": ["ok"],
        "native": [checks["native"][0][0]],  # ok, or warn where the extension is not built
        "spool": ["ok"],
    }


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_receiver_down_fails(protocol: str, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _point_at(env, protocol, f"http://127.0.0.1:{free_port()}")
    code, checks, _ = _doctor(capsys)
    assert code == 1
    [(status, message)] = checks["export"]
    assert status == "fail" and "nothing listens there" in message


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_receiver_requiring_tls(
    protocol: str, env: pytest.MonkeyPatch, pki: certs.LoopbackPki, capsys: pytest.CaptureFixture[str]
) -> None:
    with _receiver(protocol, tls=_server_tls(protocol, pki)) as rec:
        _point_at(env, protocol, f"http://127.0.0.1:{rec.port}")
        plain = _doctor(capsys)
        _point_at(env, protocol, f"https://127.0.0.1:{rec.port}")
        untrusted = _doctor(capsys)
        env.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
        trusted = _doctor(capsys)
    assert plain[0] == 1 and plain[1]["export"][0][0] == "fail"
    assert "does the receiver need TLS (https://)" in plain[1]["export"][0][1]
    assert untrusted[0] == 1 and "certificate is not trusted" in untrusted[1]["export"][0][1]
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted[1]["export"][0][1]
    assert trusted[0] == 0 and trusted[1]["export"] == [("ok", trusted[1]["export"][0][1])]
    assert "(TLS; headers: none)" in trusted[1]["export"][0][1]
    assert len(rec.requests) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_receiver_rejecting_the_credentials(
    protocol: str, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with _receiver(protocol, authorization=SECRET) as rec:
        _point_at(env, protocol, f"http://127.0.0.1:{rec.port}")
        env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20wrong-t0ken,x-team=ml")
        rejected = _doctor(capsys)
        env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=" + SECRET.replace(" ", "%20"))
        accepted = _doctor(capsys)
    code, checks, out = rejected
    assert code == 1
    [(status, message)] = checks["export"]
    assert status == "fail" and ("HTTP 401" in message or "UNAUTHENTICATED" in message)
    assert "refused the credentials: check OTEL_EXPORTER_OTLP_HEADERS (sent: authorization, x-team)" in message
    assert "  OTEL_EXPORTER_OTLP_HEADERS=authorization=***,x-team=***" in out.splitlines()
    assert "wrong-t0ken" not in out
    assert accepted[0] == 0 and accepted[1]["export"][0][0] == "ok"
    assert "s3cr3t" not in accepted[2]
    assert len(rec.requests) == 1


def test_no_endpoint_warns_and_passes(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, checks, _ = _doctor(capsys)
    assert code == 0
    assert checks["export"] == [
        ("warn", "no endpoint: OTEL_EXPORTER_OTLP_ENDPOINT is unset, so spans only go to the spool")
    ]
    assert _doctor(capsys, "--strict")[0] == 1


# --- the metrics port --------------------------------------------------------------------


def test_metrics_port_taken_by_another_program(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        env.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
        code, checks, _ = _doctor(capsys, "--timeout", "1")
    assert code == 1
    [(status, message)] = checks["prometheus"]
    assert status == "fail" and message.startswith(f"127.0.0.1:{port} is taken by another program")


@contextmanager
def _metrics_server(metric: str) -> Iterator[int]:
    registry = CollectorRegistry()
    Counter(metric, "a test counter", registry=registry).inc()
    server, thread = start_http_server(0, "127.0.0.1", registry)
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize(
    "metric, status, text",
    [
        ("otelprof_steps", "ok", "an otelprof /metrics endpoint already answers"),
        ("other_app", "fail", "taken by an HTTP server"),
    ],
)
def test_metrics_port_already_serving(
    metric: str, status: str, text: str, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with _metrics_server(metric) as port:
        env.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
        _, checks, _ = _doctor(capsys)
    assert checks["prometheus"][0][0] == status and text in checks["prometheus"][0][1]


def test_metrics_port_zero(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", "0")
    _, checks, _ = _doctor(capsys)
    assert checks["prometheus"][0][0] == "ok" and "picks a free port" in checks["prometheus"][0][1]


# --- configuration, spool, output ---------------------------------------------------------


def test_configuration_lists_values_defaults_and_problems(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("OTELPROF_DETAIL", "everything")
    env.setenv("OTELPROF_DETIAL", "full")  # a typo
    env.setenv("OTEL_SERVICE_NAME", "trainer")
    code, checks, out = _doctor(capsys)
    assert code == 0  # warnings do not fail without --strict
    lines = out.splitlines()
    assert "  OTEL_SERVICE_NAME=trainer" in lines
    assert "  OTELPROF_DETAIL=everything" in lines
    assert "  OTEL_EXPORTER_OTLP_PROTOCOL unset (default: http/protobuf)" in lines
    assert "  OTELPROF_MIN_DURATION_US unset (default: 10)" in lines
    assert not [line for line in lines if "_TRACES_" in line], "signal-specific forms only when set"
    assert ("warn", "OTELPROF_DETAIL='everything' is not 'full' or 'default'; using 'default'") in checks["config"]
    assert ("warn", "OTELPROF_DETIAL is not an otelprof variable (a typo?); ignored") in checks["config"]
    assert _doctor(capsys, "--strict")[0] == 1


def test_spool_with_waiting_requests_warns(
    env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = Spool(tmp_path / "spool")
    for _ in range(3):
        spool.write(b"\x0a\x00")
    _, checks, _ = _doctor(capsys)
    [(status, message)] = checks["spool"]
    assert status == "warn" and message.startswith(f"{tmp_path / 'spool'}: 3 requests (6 bytes) waiting")
    assert "otelprof spool replay --endpoint URL" in message  # no endpoint is configured


def test_a_spool_folder_others_can_write_fails(
    env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job refuses such a folder (spool.py); doctor says so rather than "empty"."""
    folder = tmp_path / "spool"
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    _, checks, _ = _doctor(capsys)
    [(status, message)] = checks["spool"]
    assert status == "fail" and str(folder) in message and "chmod 700" in message


def test_a_spool_folder_the_system_cannot_look_at_fails_in_one_line(
    env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link on the way to the folder names a file too long for the system: looking at the
    folder raised OSError (ENAMETOOLONG), which doctor reported as a bug of its own."""
    (tmp_path / "link").symlink_to("x" * 300)
    folder = tmp_path / "link" / "spool"
    env.setenv("OTELPROF_SPOOL_DIR", str(folder))
    code, checks, out = _doctor(capsys)
    reason = os.strerror(errno.ENAMETOOLONG)
    assert checks["spool"] == [("fail", f"{quoted(str(folder))}: cannot read it ({reason}): set OTELPROF_SPOOL_DIR")]
    assert code == 1 and "Traceback" not in out


def test_long_and_control_values_are_shown_quoted_cut_short_and_masked_first(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 100k-character value made 100k-character lines (the listing, the warning, the export
    check). Masking comes before cutting: the cut keeps the URL's start, where a password is."""
    endpoint = "http://us3r:pa55w0rd@[" + "h" * 100_000  # not a URL (an unclosed IPv6 bracket)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    env.setenv("OTEL_SERVICE_NAME", "s" * 100_000)
    env.setenv("OTELPROF_RUN_ID", "run\x1b[31m")
    code, checks, out = _doctor(capsys)
    assert code == 0 and "us3r" not in out and "pa55w0rd" not in out
    lines = out.splitlines()
    assert [line[:100] for line in lines if len(line) > 400] == []
    shown = quoted("http://***@[" + "h" * 100_000)
    assert f"  OTEL_EXPORTER_OTLP_ENDPOINT={shown}" in lines
    assert f"  OTEL_SERVICE_NAME={quoted('s' * 100_000)}" in lines
    assert "  OTELPROF_RUN_ID='run\\x1b[31m'" in lines  # no terminal escape reaches the screen
    assert (
        "warn",
        f"OTEL_EXPORTER_OTLP_ENDPOINT={shown} is not an http(s) URL; ignored: spans go to the spool,"
        " as with no endpoint",
    ) in checks["config"]
    assert checks["export"] == [
        (
            "warn",
            f"no endpoint: OTEL_EXPORTER_OTLP_ENDPOINT={shown} is not an http(s) URL, so spans only go to the spool",
        )
    ]


def test_json_format(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _point_at(env, "grpc", f"http://127.0.0.1:{free_port()}")
    env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=" + SECRET)
    assert main(["doctor", "--no-torch", "--format", "json"]) == 1
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["ok"] is False and SECRET not in out
    config = {s["name"]: s for s in doc["configuration"]}
    assert config["OTEL_EXPORTER_OTLP_HEADERS"]["value"] == "api-key=***"
    assert config["OTEL_EXPORTER_OTLP_TIMEOUT"] == {
        "name": "OTEL_EXPORTER_OTLP_TIMEOUT",
        "value": None,
        "default": "10000",
    }
    statuses = {c["name"]: c["status"] for c in doc["checks"]}
    assert statuses["export"] == "fail" and statuses["spool"] == "ok"


def test_quiet_prints_only_failures(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _point_at(env, "http/protobuf", f"http://127.0.0.1:{free_port()}")
    code, checks, out = _doctor(capsys, "-q")
    assert code == 1
    assert list(checks) == ["export"] and out.count("\n") == 1


# --- torch, and as a program ---------------------------------------------------------------


def test_torch_checks(env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    assert f"[ ok ] torch: torch {torch.__version__} ({build} build)" in lines
    if not torch.version.cuda:
        assert "[skip] cuda: a CPU build of torch: CPU operators only, no kernels" in lines
    elif torch.cuda.is_available():
        assert [line for line in lines if line.startswith("[ ok ] cupti: torch.profiler records CUDA kernels")]


def _program(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120, check=False
    )


def test_python_m_otelprof_doctor(env: pytest.MonkeyPatch) -> None:
    import os

    environ = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    proc = _program("-m", "otelprof", "doctor", "--no-torch", env=environ)
    assert proc.returncode == 1, proc.stderr
    assert [
        line for line in proc.stdout.splitlines() if line.startswith("[FAIL] export: http/protobuf http://127.0.0.1:")
    ]
    # without torch installed the torch line is skipped, not failed
    code = "import sys; sys.modules['torch'] = None; from otelprof.cli import main; sys.exit(main(['doctor']))"
    proc = _program("-c", code, env={k: v for k, v in environ.items() if k != "OTEL_EXPORTER_OTLP_ENDPOINT"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("[skip] torch: not installed")]


# --- secrets -------------------------------------------------------------------------------

USER, PASSWORD = "us3r-t0ken", "pa:ss-w0rd"  # a token is often the URL's user name
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
HOSTILE = {
    # name: (protocol, the variables (PORT: a receiver requiring BASIC), the export check's status)
    "password in the URL": ("http/protobuf", {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}:pa%3Ass-w0rd@PORT"}, "ok"),
    "password in the URL, gRPC": ("grpc", {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}:pa%3Ass-w0rd@PORT"}, "ok"),
    "token as the user name": ("http/protobuf", {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}@PORT"}, "fail"),
    "CR/LF in a header value": (
        "http/protobuf",
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}:pa%3Ass-w0rd@PORT",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-team=ml,authorization=Bearer TOKSECRET%0D%0AX: y",
        },
        "ok",
    ),
    "unparseable URL": ("grpc", {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{USER}:pa%3Ass-w0rd@[::1"}, "warn"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_doctor_never_prints_a_secret(case: str, env: pytest.MonkeyPatch) -> None:
    """Text and --json, at -vv: every check runs, the URL's credentials are used (the receiver
    wants them), and no user name, password or header value is printed."""
    import os

    protocol, variables, export_status = HOSTILE[case]
    with _receiver(protocol, authorization=BASIC) as rec:
        env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        for name, value in variables.items():
            env.setenv(name, value.replace("PORT", f"127.0.0.1:{rec.port}"))
        text = _program("-m", "otelprof", "doctor", "--no-torch", "-vv", "--timeout", "5", env=dict(os.environ))
        as_json = _program("-m", "otelprof", "doctor", "--no-torch", "-vv", "--format", "json", env=dict(os.environ))
    for proc in (text, as_json):
        assert proc.returncode == (1 if export_status == "fail" else 0), proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        for secret in (USER, PASSWORD, "pa%3Ass-w0rd", "TOKSECRET"):
            assert secret not in proc.stdout + proc.stderr, secret
    doc = json.loads(as_json.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert list(checks) == ["config", "export", "prometheus", "native", "spool"]
    assert checks["export"]["status"] == export_status, checks["export"]["message"]
    endpoint = {s["name"]: s["value"] for s in doc["configuration"]}["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert endpoint.startswith("http://***@")
    assert [line for line in text.stdout.splitlines() if line.startswith("  OTEL_EXPORTER_OTLP_ENDPOINT=http://***@")]
    if export_status == "ok":
        assert "; headers: " in checks["export"]["message"] and "authorization" in checks["export"]["message"]
        assert len(rec.requests) == 2  # doctor's empty Export, once per format
    if case == "token as the user name":  # its user name alone is not the receiver's password
        assert "refused the credentials" in checks["export"]["message"]
    if case == "CR/LF in a header value":
        assert {
            "status": "warn",
            "message": (
                "OTEL_EXPORTER_OTLP_HEADERS: header 'authorization' has a control or non-ASCII character in its value;"
                " skipped"
            ),
            "name": "config",
        } in doc["checks"]
    if case == "unparseable URL":
        assert checks["export"]["message"] == (
            "no endpoint: OTEL_EXPORTER_OTLP_ENDPOINT='http://***@[::1' is not an http(s) URL, "
            "so spans only go to the spool"
        )


def test_mask() -> None:
    from otelprof.report.doctor import mask

    assert mask("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer x,Bearer y,a: b=c") == "Authorization=***,***,***"
    assert mask("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://t0ken@h/v1/traces?k=v") == "https://***@h/v1/traces?***"
    assert mask("OTELPROF_SOMETHING", "http://u:p@h") == "http://***@h"
    assert mask("OTEL_SERVICE_NAME", "me@corp") == "me@corp"
    assert mask("OTELPROF_PROFILE_TOKEN", "s3cret-trigger") == "***"
