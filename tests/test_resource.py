"""Resource attributes and conversion options from the environment."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof import ConvertOptions, __version__, convert
from otelprof.resource import options_from_env, resource_attributes_from_env
from otelprof.settings.variables import (
    OTEL_RESOURCE_ATTRIBUTES,
    OTEL_SERVICE_NAME,
    OTELPROF_DETAIL,
    OTELPROF_MAX_REQUEST_BYTES,
    OTELPROF_MIN_DURATION_US,
    OTELPROF_RUN_ID,
)

LOGGER = "otelprof.resource"


def _attrs(value: str, service: str | None = None) -> tuple[tuple[str, str], ...]:
    env = {OTEL_RESOURCE_ATTRIBUTES: value}
    if service is not None:
        env[OTEL_SERVICE_NAME] = service
    return resource_attributes_from_env(env)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


# --- OTEL_RESOURCE_ATTRIBUTES ------------------------------------------------------------


def test_unset_and_empty_give_nothing(caplog: pytest.LogCaptureFixture) -> None:
    assert resource_attributes_from_env({}) == ()
    assert _attrs("") == ()
    assert _attrs(" , ,, ") == ()
    assert _attrs("", service="") == ()
    assert _warnings(caplog) == []


def test_plain_pairs_keep_their_order() -> None:
    assert _attrs("deployment.environment=prod,k8s.pod.name=trainer-0,team=ml") == (
        ("deployment.environment", "prod"),
        ("k8s.pod.name", "trainer-0"),
        ("team", "ml"),
    )


@pytest.mark.parametrize(
    "raw, value",
    [
        ("ml%20infra", "ml infra"),
        ("a%2Cb", "a,b"),  # an encoded comma is not a separator
        ("x%3Dy", "x=y"),
        ("%E2%9C%93", "\u2713"),  # UTF-8
        ("%e2%9c%93", "\u2713"),  # lowercase hex
        ("100%25", "100%"),
        ("a+b", "a+b"),  # '+' is not a space in percent-encoding
        ("", ""),
    ],
)
def test_values_are_percent_decoded(raw: str, value: str) -> None:
    assert _attrs(f"key={raw}") == (("key", value),)


def test_whitespace_around_keys_and_values_is_ignored() -> None:
    assert _attrs("  a = 1 ,\tb=two words  ") == (("a", "1"), ("b", "two words"))


def test_first_equals_sign_splits() -> None:
    assert _attrs("url=https://x.example/?a=b") == (("url", "https://x.example/?a=b"),)


def test_later_duplicate_wins() -> None:
    assert _attrs("a=1,b=2,a=3") == (("a", "3"), ("b", "2"))


@pytest.mark.parametrize(
    "entry, reason",
    [
        ("novalue", "no '='"),
        ("=orphan", "empty key"),
        ("bad key=v", "key is not a token"),
        ("k(1)=v", "key is not a token"),
        ("pct=%zz", "bad percent-encoding"),
        ("pct=50%", "bad percent-encoding"),
        ("utf=%FF%FE", "bad percent-encoding"),
    ],
)
def test_invalid_entry_is_skipped_with_one_warning(entry: str, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _attrs(f"good=1,{entry},also.good=2") == (("good", "1"), ("also.good", "2"))
    warnings = _warnings(caplog)
    assert len(warnings) == 1
    assert OTEL_RESOURCE_ATTRIBUTES in warnings[0]
    assert repr(entry) in warnings[0]
    assert reason in warnings[0]


def test_invalid_entries_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    """The first is named, the others counted: 50,000 bad entries are one line, not 50,000."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _attrs("a,b,c=3") == (("c", "3"),)
        assert _attrs(",".join(["x"] * 50_000)) == ()
    assert _warnings(caplog) == [
        "OTEL_RESOURCE_ATTRIBUTES: ignoring invalid entry 'a' (no '=') (and 1 more entries skipped)",
        "OTEL_RESOURCE_ATTRIBUTES: ignoring invalid entry 'x' (no '=') (and 49999 more entries skipped)",
    ]


@given(st.text())
def test_never_raises(value: str) -> None:
    attrs = resource_attributes_from_env({OTEL_RESOURCE_ATTRIBUTES: value, OTEL_SERVICE_NAME: value})
    assert all(isinstance(k, str) and k and isinstance(v, str) for k, v in attrs)
    assert len({k for k, _ in attrs}) == len(attrs)


# --- service.name ------------------------------------------------------------------------


def test_service_name_from_attributes_comes_first() -> None:
    assert _attrs("team=ml,service.name=trainer,zone=a") == (
        ("service.name", "trainer"),
        ("team", "ml"),
        ("zone", "a"),
    )


def test_otel_service_name_overrides_the_attribute() -> None:
    assert _attrs("team=ml,service.name=from-attrs", service="from-var") == (
        ("service.name", "from-var"),
        ("team", "ml"),
    )


def test_otel_service_name_alone() -> None:
    assert resource_attributes_from_env({OTEL_SERVICE_NAME: " trainer "}) == (("service.name", "trainer"),)


def test_empty_otel_service_name_is_unset() -> None:
    assert _attrs("service.name=kept", service="") == (("service.name", "kept"),)


def test_service_name_reaches_the_exported_resource() -> None:
    """End to end: the attributes become the OTLP resource (here on a tiny synthetic trace)."""
    trace = (
        b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 50}]}'
    )
    opts = options_from_env({OTEL_SERVICE_NAME: "trainer", OTEL_RESOURCE_ATTRIBUTES: "team=ml%20infra"})
    result = convert(trace, options=opts, engine="reference")
    request = ExportTraceServiceRequest.FromString(result.requests[0])
    resource = [(kv.key, kv.value.string_value) for kv in request.resource_spans[0].resource.attributes]
    assert resource[:2] == [("service.name", "trainer"), ("team", "ml infra")]


# --- OTELPROF_* --------------------------------------------------------------------------


def test_options_defaults(caplog: pytest.LogCaptureFixture) -> None:
    opts = options_from_env({})
    assert opts == ConvertOptions(scope_version=__version__)
    assert _warnings(caplog) == []


def test_options_from_each_variable() -> None:
    env = {
        OTELPROF_DETAIL: " FULL ",
        OTELPROF_RUN_ID: "run-42",
        OTELPROF_MAX_REQUEST_BYTES: "65536",
        OTELPROF_MIN_DURATION_US: "2.5",
        OTEL_SERVICE_NAME: "trainer",
    }
    opts = options_from_env(env)
    assert opts.detail == "full"
    assert opts.run_id == "run-42"
    assert opts.max_request_bytes == 65536
    assert opts.min_duration_ns == 2500
    assert opts.resource_attributes == (("service.name", "trainer"),)
    assert opts.scope_version == __version__


@pytest.mark.parametrize(
    "name, value, field, default",
    [
        (OTELPROF_DETAIL, "verbose", "detail", "default"),
        (OTELPROF_MAX_REQUEST_BYTES, "lots", "max_request_bytes", ConvertOptions().max_request_bytes),
        (OTELPROF_MAX_REQUEST_BYTES, "100", "max_request_bytes", ConvertOptions().max_request_bytes),
        (OTELPROF_MIN_DURATION_US, "-1", "min_duration_ns", ConvertOptions().min_duration_ns),
        (OTELPROF_MIN_DURATION_US, "nan", "min_duration_ns", ConvertOptions().min_duration_ns),
        (OTELPROF_MIN_DURATION_US, "10us", "min_duration_ns", ConvertOptions().min_duration_ns),
    ],
)
def test_bad_value_warns_and_falls_back(
    name: str, value: str, field: str, default: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        opts = options_from_env({name: value})
    assert getattr(opts, field) == default
    warnings = _warnings(caplog)
    assert len(warnings) == 1
    assert name in warnings[0] and repr(value) in warnings[0]
    assert "using" in warnings[0]


def test_empty_values_mean_default(caplog: pytest.LogCaptureFixture) -> None:
    env = {OTELPROF_DETAIL: "", OTELPROF_RUN_ID: "  ", OTELPROF_MAX_REQUEST_BYTES: "", OTELPROF_MIN_DURATION_US: ""}
    assert options_from_env(env) == ConvertOptions(scope_version=__version__)
    assert _warnings(caplog) == []


def test_overrides_win_over_the_environment() -> None:
    opts = options_from_env({OTELPROF_DETAIL: "full", OTELPROF_RUN_ID: "env"}, detail="default", run_id="arg")
    assert (opts.detail, opts.run_id) == ("default", "arg")


def test_bad_override_raises() -> None:
    with pytest.raises(ValueError, match="detail"):
        options_from_env({}, detail="most")
