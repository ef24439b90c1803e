"""The settings registry: one dialect (the OpenTelemetry specification's), defaults that agree
with the code's, and the docs' tables generated from it."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from otelprof import settings
from otelprof.capture.config import settings_from_env
from otelprof.capture.metrics import otlp_metrics
from otelprof.capture.windows.profiling import WindowSettings
from otelprof.converter import ConvertOptions
from otelprof.export import exporter_config_from_env
from otelprof.resource import options_from_env
from otelprof.settings import VARIABLES, Bool, Host, Int, Names, Number, render_tables
from otelprof.settings._tables import documents

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("TRUE", True), ("True", True), ("false", False)])
def test_boolean_is_true_or_false_in_any_case(raw: str, expected: bool) -> None:
    assert Bool().parse(raw) is expected


@pytest.mark.parametrize("raw", ["1", "yes", "on", "0", "no", "off", "enabled"])
def test_other_booleans_warn_and_keep_the_default(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    """``1/yes/on`` (and ``0/no/off``) were accepted by OTELPROF_ENABLED, _PROFILE, _TRIGGER_HTTP and
    _CUDA_EVENTS before the registry; the specification's dialect makes them a warning."""
    with caplog.at_level(logging.WARNING):
        config = settings_from_env({"OTELPROF_PROFILE": raw, "OTELPROF_CUDA_EVENTS": raw})
    assert config.windows.enabled is True and config.cuda_events is True
    messages = [r.getMessage() for r in caplog.records]
    assert f"OTELPROF_PROFILE={raw!r} is not true or false; using true" in messages
    assert f"OTELPROF_CUDA_EVENTS={raw!r} is not true or false; using true" in messages


@pytest.mark.parametrize("raw", ["1.5", "0x10", "ten", "-1", "1_000", "١٢"])
def test_integers_are_decimal_in_range(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        value = settings.parse({"X": raw}, "X", Int(0), 7)
    assert value == 7
    assert [r.getMessage() for r in caplog.records] == [
        f"X={raw!r} is not an integer from 0 to 9223372036854775807; using 7"
    ]


@pytest.mark.parametrize(
    "raw", ["localhost", "0.0.0.0", "::", "::1", "fe80::1%eth0", "metrics-1.example.com.", "my_svc"]
)
def test_hosts_are_addresses_or_host_names(raw: str) -> None:
    assert Host().parse(raw) == raw


@pytest.mark.parametrize(
    "raw",
    ["http://[::1", "../../etc/passwd", "host:9464", "-1", "999", "a b", "x" * 254, "١٢٣", "fe80::1%" + "x" * 56],
)
def test_other_hosts_warn_and_keep_the_default(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    """Before, OTEL_EXPORTER_PROMETHEUS_HOST took any text: a long one made the metrics server
    and ``otelprof doctor`` raise UnicodeError (the IDNA codec) instead of failing to resolve.
    So did an IPv6 address whose zone makes a label past 63 characters (the session stopped)."""
    with caplog.at_level(logging.WARNING):
        assert settings_from_env({"OTEL_EXPORTER_PROMETHEUS_HOST": raw}).metrics_host == "localhost"
    assert [r.getMessage() for r in caplog.records] == [
        f"OTEL_EXPORTER_PROMETHEUS_HOST={settings.quoted(raw)} is not an IP address or a host name; using localhost"
    ]


@pytest.mark.parametrize("raw", ["SIG_DFL", "SIG_BLOCK", "_ign", "KILL", "sigstop", "SIGNOPE"])
def test_the_trigger_signal_is_one_a_handler_can_take(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    """``SIG_DFL``/``SIG_BLOCK`` (integers of the signal module, no signals) made settings_from_env
    raise ValueError into ``import otelprof.auto``; ``SIG_IGN`` became SIGHUP; KILL and STOP made
    the windows raise OSError at the first step (otelprof switched itself off)."""
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # else the default is left alone too
    with caplog.at_level(logging.WARNING):
        assert settings_from_env({"OTELPROF_TRIGGER_SIGNAL": raw}).windows.trigger_signal == signal.SIGUSR2
    assert [r.getMessage() for r in caplog.records] == [
        f"OTELPROF_TRIGGER_SIGNAL={raw!r} is not a signal a handler can take; using SIGUSR2"
    ]
    assert settings_from_env({"OTELPROF_TRIGGER_SIGNAL": "usr1"}).windows.trigger_signal == signal.SIGUSR1


@pytest.mark.parametrize("raw", ["nan", "inf", "-2", "fast", "1_0", "0x1p3"])
def test_numbers_are_finite_and_checked(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    kind = Number(lambda v: v >= 0, "a non-negative number")
    with caplog.at_level(logging.WARNING):
        assert settings.parse({"X": raw}, "X", kind, 1.0) == 1.0
    assert len(caplog.records) == 1 and "X=" in caplog.records[0].getMessage()


@pytest.mark.parametrize(("raw", "value"), [("2.5", 2.5), ("1e3", 1000.0), (".5", 0.5), ("+7", 7.0)])
def test_decimal_numbers(raw: str, value: float) -> None:
    assert Number(lambda v: True, "a number").parse(raw) == value


def test_enumerations_take_any_case() -> None:
    """Before the registry, OTEL_EXPORTER_OTLP_PROTOCOL had to be lower case (``GRPC`` warned)."""
    assert exporter_config_from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "GRPC"}).protocol == "grpc"
    assert options_from_env({"OTELPROF_DETAIL": "Full"}).detail == "full"


def test_name_lists_keep_their_known_entries_and_warn_once_for_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    """OTEL_METRICS_EXPORTER and OTELPROF_PROFILE_OPTIONS: parsed by the registry's ``Names`` kind
    (any case, no repeats, in order); unknown entries are skipped in one warning, the rest kept."""
    assert otlp_metrics.exporters({}) == {"prometheus"}
    assert otlp_metrics.exporters({"OTEL_METRICS_EXPORTER": " OTLP , prometheus,otlp"}) == {"otlp", "prometheus"}
    assert otlp_metrics.exporters({"OTEL_METRICS_EXPORTER": "none"}) == set()
    assert settings.value({"OTEL_METRICS_EXPORTER": "otlp,Prometheus,otlp"}, "OTEL_METRICS_EXPORTER") == (
        "otlp",
        "prometheus",
    )
    with caplog.at_level(logging.WARNING):
        got = otlp_metrics.exporters({"OTEL_METRICS_EXPORTER": "zipkin,otlp,,console"})
    assert got == {"otlp"}
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith("OTEL_METRICS_EXPORTER='zipkin,otlp,,console': 'zipkin' and 1 more not ")
    assert message.endswith("; using otlp")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        windows = settings_from_env({"OTELPROF_PROFILE_OPTIONS": "Record_Shapes,with_stack,bogus"}).windows
    assert (windows.record_shapes, windows.with_stack, windows.profile_memory) == (True, True, False)
    [message] = [r.getMessage() for r in caplog.records]
    assert "'bogus' not a comma-separated list of 'record_shapes'" in message
    assert message.endswith("; using record_shapes,with_stack")
    assert Names(("a", "b")).show(()) == "none"


def test_empty_is_unset_and_never_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        for name in VARIABLES:
            settings.value({name: "  "}, name)
    assert caplog.records == []


def test_registry_defaults_are_the_code_defaults() -> None:
    """The defaults the tables show are the ones the readers give."""
    windows, options = settings_from_env({}).windows, options_from_env({})
    assert windows == WindowSettings(
        skip_first=VARIABLES["OTELPROF_PROFILE_SKIP_FIRST"].default,
        wait=VARIABLES["OTELPROF_PROFILE_WAIT"].default,
        warmup=VARIABLES["OTELPROF_PROFILE_WARMUP"].default,
        active=VARIABLES["OTELPROF_PROFILE_ACTIVE"].default,
        repeat=VARIABLES["OTELPROF_PROFILE_REPEAT"].default,
        early=VARIABLES["OTELPROF_PROFILE_EARLY"].default,
        on_demand_steps=VARIABLES["OTELPROF_ON_DEMAND_STEPS"].default,
        anomaly_factor=VARIABLES["OTELPROF_ANOMALY_FACTOR"].default,
        trigger_signal=windows.trigger_signal,
    )
    defaults = ConvertOptions()
    assert options.max_request_bytes == defaults.max_request_bytes == VARIABLES["OTELPROF_MAX_REQUEST_BYTES"].default
    assert options.span_budget == defaults.span_budget == VARIABLES["OTELPROF_SPAN_BUDGET"].default
    assert options.split_world_size == defaults.split_world_size == VARIABLES["OTELPROF_SPLIT_WORLD_SIZE"].default
    assert options.min_duration_ns == defaults.min_duration_ns == VARIABLES["OTELPROF_MIN_DURATION_US"].default * 1000


def test_every_variable_has_a_doc_and_a_group() -> None:
    groups = {"live", "windows", "distributed", "convert", "export"}
    for var in VARIABLES.values():
        assert var.doc.strip() and var.group in groups, var.name
        assert var.general is None or var.general in VARIABLES, var.name


def test_docs_tables_are_the_registry_s() -> None:
    """Regenerate with ``python -m otelprof.settings --write`` (README.md and docs/*.md)."""
    tables: list[str] = []
    for path in documents(ROOT):
        text = path.read_text("utf-8")
        tables += re.findall(r"<!-- env-table: (\w+) -->", text)
        assert render_tables(text) == text, path
    assert sorted(tables) == sorted({var.group for var in VARIABLES.values()}), "each group's table once"


def test_the_regenerating_script_checks_the_docs_by_default() -> None:
    proc = subprocess.run([sys.executable, "-m", "otelprof.settings"], cwd=ROOT, capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_the_regenerating_script_reports_stale_tables(tmp_path: Path) -> None:
    stale = tmp_path / "doc.md"
    stale.write_text("x\n<!-- env-table: distributed -->\n| old |\n<!-- /env-table -->\n")
    run = [sys.executable, "-m", "otelprof.settings", str(stale)]
    assert subprocess.run(run, capture_output=True).returncode == 1
    assert subprocess.run([*run, "--write"], capture_output=True).returncode == 0
    assert "`OTELPROF_STRAGGLER_STEPS` | `100`" in stale.read_text()
    assert subprocess.run(run, capture_output=True).returncode == 0


def test_the_regenerating_script_has_help_and_one_line_errors(tmp_path: Path) -> None:
    """``--help`` was read as a file name (a FileNotFoundError traceback)."""
    proc = subprocess.run([sys.executable, "-m", "otelprof.settings", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m otelprof.settings [-h] [--write] [FILE ...]")
    missing = tmp_path / "missing.md"
    proc = subprocess.run([sys.executable, "-m", "otelprof.settings", str(missing)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr == f"python -m otelprof.settings: error: {missing}: No such file or directory\n"
