"""OTLP exporter configuration follows the OpenTelemetry specification's environment variables."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest

from otelprof.export import ExporterConfig, exporter_config_from_env
from otelprof.export.config import why_no_endpoint
from otelprof.export.redact import redact_url

LOGGER = "otelprof.export.config"


def test_defaults_are_the_specification_defaults() -> None:
    cfg = exporter_config_from_env({})
    assert cfg == ExporterConfig()
    assert (cfg.protocol, cfg.url, cfg.endpoint_configured) == (
        "http/protobuf",
        "http://localhost:4318/v1/traces",
        False,
    )
    assert (cfg.compression, cfg.timeout_s, cfg.insecure, cfg.disabled) == ("none", 10.0, True, False)
    grpc = exporter_config_from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert (grpc.url, grpc.target, grpc.insecure) == ("http://localhost:4317", "localhost:4317", True)


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "http://collector:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw.example/otlp"}, "https://gw.example/otlp/v1/traces"),
        # the signal-specific endpoint is used as is, and wins
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:9/x"},
            "http://b:9/x",
        ),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:9"}, "http://b:9/"),
    ],
)
def test_http_endpoint_path_rules(env: dict[str, str], url: str) -> None:
    cfg = exporter_config_from_env(env)
    assert (cfg.url, cfg.endpoint_configured) == (url, True)


@pytest.mark.parametrize(
    ("endpoint", "insecure_env", "url", "insecure"),
    [
        ("https://collector:4317", None, "https://collector:4317", False),
        ("http://collector:4317", None, "http://collector:4317", True),
        ("collector:4317", None, "https://collector:4317", False),  # no scheme: TLS unless INSECURE
        ("collector:4317", "true", "http://collector:4317", True),
        ("https://collector:4317", "true", "https://collector:4317", False),  # the scheme decides
        ("collector", None, "https://collector:4317", False),
    ],
)
def test_grpc_transport_security(endpoint: str, insecure_env: str | None, url: str, insecure: bool) -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    if insecure_env is not None:
        env["OTEL_EXPORTER_OTLP_INSECURE"] = insecure_env
    cfg = exporter_config_from_env(env)
    assert (cfg.url, cfg.insecure) == (url, insecure)


def test_signal_specific_variables_replace_general_ones(tmp_path: Path) -> None:
    ca, other = tmp_path / "ca.pem", tmp_path / "other.pem"
    ca.write_text("ca")
    other.write_text("other")
    cfg = exporter_config_from_env(
        {
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_HEADERS": "a=1",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=2",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1000",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2500",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(other),
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(ca),
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false",
        }
    )
    assert cfg.protocol == "http/protobuf"
    assert cfg.headers == (("b", "2"),)
    assert (cfg.compression, cfg.timeout_s, cfg.certificate) == ("gzip", 2.5, str(ca))


def test_headers_are_percent_decoded_and_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    secret = "Bearer%20s3cr3t"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cfg = exporter_config_from_env({"OTEL_EXPORTER_OTLP_HEADERS": f"Authorization={secret},broken, x-tenant = ml "})
    assert cfg.headers == (("authorization", "Bearer s3cr3t"), ("x-tenant", "ml"))
    assert cfg.header_names == ("authorization", "x-tenant")
    assert "s3cr3t" not in repr(cfg)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["OTEL_EXPORTER_OTLP_HEADERS: entry 2 is not key=value; skipped"]
    assert not any("s3cr3t" in m for m in messages)


def test_many_bad_header_entries_are_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cfg = exporter_config_from_env({"OTEL_EXPORTER_OTLP_HEADERS": ",".join(["broken"] * 10_000) + ",a=b"})
    assert cfg.headers == (("a", "b"),)
    assert [r.getMessage() for r in caplog.records] == [
        "OTEL_EXPORTER_OTLP_HEADERS: entry 1 is not key=value; skipped (and 9999 more entries skipped)"
    ]


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", ("protocol", "http/protobuf")),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli", ("compression", "none")),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon", ("timeout_s", 10.0)),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "-5", ("timeout_s", 10.0)),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://x", ("url", "http://localhost:4318/v1/traces")),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318", ("url", "http://localhost:4318/v1/traces")),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/such/ca.pem", ("certificate", None)),
        ("OTEL_SDK_DISABLED", "yes", ("disabled", False)),
    ],
)
def test_bad_values_warn_with_the_variable_and_fall_back(
    caplog: pytest.LogCaptureFixture, name: str, value: str, expected: tuple[str, object]
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cfg = exporter_config_from_env({name: value})
    field_name, fallback = expected
    assert getattr(cfg, field_name) == fallback
    (record,) = caplog.records
    assert name in record.getMessage()
    assert repr(value) in record.getMessage()


@pytest.mark.parametrize(("value", "disabled"), [("true", True), ("TRUE", True), ("false", False), ("", False)])
def test_sdk_disabled(value: str, disabled: bool) -> None:
    assert exporter_config_from_env({"OTEL_SDK_DISABLED": value}).disabled is disabled


# --- credentials: URL user info, header values ------------------------------------------------


def _basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


@pytest.mark.parametrize(
    ("userinfo", "credentials"),
    [
        ("us3r:pa%3As%40s", "us3r:pa:s@s"),  # percent-decoded (RFC 7617: the first colon splits)
        ("t0ken", "t0ken:"),  # a user name alone: an empty password
        ("%C3%BCser:p%C3%A4ss", "\u00fcser:p\u00e4ss"),  # UTF-8
    ],
)
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_url_user_info_becomes_basic_authentication(
    caplog: pytest.LogCaptureFixture, protocol: str, userinfo: str, credentials: str
) -> None:
    with caplog.at_level(logging.DEBUG, logger="otelprof"):
        cfg = exporter_config_from_env(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{userinfo}@collector:4000/otlp",
                "OTEL_EXPORTER_OTLP_HEADERS": "x-team=ml",
            }
        )
    url = "http://collector:4000" if protocol == "grpc" else "http://collector:4000/otlp/v1/traces"
    assert (cfg.url, cfg.target, cfg.endpoint_configured) == (url, "collector:4000", True)
    assert cfg.headers == (("x-team", "ml"), ("authorization", _basic(credentials)))
    assert caplog.records == []


def test_an_authorization_header_wins_over_url_credentials(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="otelprof"):
        cfg = exporter_config_from_env(
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t0ken:hunter2@collector/v1/traces",
                "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20s3cr3t",
            }
        )
    assert (cfg.url, cfg.headers) == ("https://collector/v1/traces", (("authorization", "Bearer s3cr3t"),))
    assert [r.getMessage() for r in caplog.records] == [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT has credentials and OTEL_EXPORTER_OTLP_HEADERS sets authorization: "
        "the header is sent, the URL's credentials are not"
    ]


@pytest.mark.parametrize(
    ("protocol", "entry", "message"),
    [
        ("http/protobuf", "authorization=Bearer s3cr3t%0D%0AX: y", "header 'authorization' has a control"),
        ("http/protobuf", "x-key=s3cr3t%0A", "header 'x-key' has a control"),
        ("http/protobuf", "x-key=s3%00cr3t", "header 'x-key' has a control"),
        ("http/protobuf", "x-key=s3%7Fcr3t", "header 'x-key' has a control"),
        ("http/protobuf", "x-key=s3%09cr3t", "header 'x-key' has a control"),  # gRPC refuses a tab too
        ("http/protobuf", "x-key=s3cr3t\u20ac", "header 'x-key' has a control or non-ASCII"),
        ("grpc", "x-key=s3cr3t%C3%A9", "header 'x-key' has a control or non-ASCII"),
        ("http/protobuf", "Bearer s3cr3t:x=1", "entry 2: the header name is not an HTTP token"),
        ("http/protobuf", "\u212a=s3cr3t", "entry 2: the header name is not an HTTP token"),  # lower() is "k"
        ("grpc", "x!key=s3cr3t", "header 'x!key' is not a gRPC text metadata key"),
        ("grpc", "x-key-bin=s3cr3t", "header 'x-key-bin' is not a gRPC text metadata key"),
    ],
)
def test_headers_that_cannot_be_sent_are_refused_by_name(
    caplog: pytest.LogCaptureFixture, protocol: str, entry: str, message: str
) -> None:
    with caplog.at_level(logging.DEBUG, logger="otelprof"):
        cfg = exporter_config_from_env(
            {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_EXPORTER_OTLP_HEADERS": f"x-team=ml,{entry}"}
        )
    assert cfg.headers == (("x-team", "ml"),)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(f"OTEL_EXPORTER_OTLP_HEADERS: {message}")
    assert "s3cr3t" not in record.getMessage() and "Bearer" not in record.getMessage()


@pytest.mark.parametrize(
    ("endpoint", "shown"),
    [
        ("http://[::1", "'http://[::1'"),
        ("http://u5er:hunter2@[::1", "'http://***@[::1'"),
        ("http://host:99999", "'http://host:99999'"),
        ("http://t0ken@host:abc", "'http://***@host:abc'"),
        ("http://u5er:hun#ter2@host:4318", "'http://***@host:4318'"),  # an unencoded # in the password
        ("ftp://u5er:hunter2@host/x?key=k3y", "'ftp://***@host/x?***'"),
    ],
)
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_unusable_endpoints_warn_once_masked_and_fall_back(
    caplog: pytest.LogCaptureFixture, protocol: str, endpoint: str, shown: str
) -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    with caplog.at_level(logging.DEBUG, logger="otelprof"):
        cfg = exporter_config_from_env(env)
        why = why_no_endpoint(env)
    assert (cfg.endpoint_configured, cfg.headers) == (False, ())
    assert [r.getMessage() for r in caplog.records] == [
        f"OTEL_EXPORTER_OTLP_ENDPOINT={shown} is not an http(s) URL; ignored: spans go to the spool, "
        "as with no endpoint"
    ]
    assert why == f"OTEL_EXPORTER_OTLP_ENDPOINT={shown} is not an http(s) URL"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://u:p@h:1/x?k=v#f", "http://***@h:1/x?***"),
        ("https://t0ken@h", "https://***@h"),
        ("t0ken@h:4317", "***@h:4317"),  # a gRPC endpoint without a scheme
        ("http://u:p/q@h", "http://***@h"),  # an unencoded / in the password
        ("http://u:p@[::1", "http://***@[::1"),
        ("http://h:4318/v1/traces", "http://h:4318/v1/traces"),
    ],
)
def test_redact_url(text: str, shown: str) -> None:
    assert redact_url(text) == shown
