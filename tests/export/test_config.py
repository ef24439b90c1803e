"""OTLP exporter configuration follows the OpenTelemetry specification's environment variables."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from otelprof.export import ExporterConfig, exporter_config_from_env

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
