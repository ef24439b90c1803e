"""The line an instrumented process writes once to stderr (otelprof/capture/announce.py): real
training subprocesses under ``otelprof run`` and ``import otelprof.auto``, each checked
against where its data really went."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from export.receivers import HttpReceiver, free_port, http_receiver

from otelprof.capture.announce import metrics_part, windows_part
from otelprof.capture.config import settings_from_env
from otelprof.cli.demo import demo_environment

ROOT = Path(__file__).resolve().parents[1]
LOOP = ROOT / "tests" / "capture" / "train_loop.py"
STEPS = 3
LINE = re.compile(r"^otelprof: spans → .*$", re.M)


def _train(tmp_path: Path, command: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTELPROF_RUN_ID="announce",
        OTELPROF_SPOOL_DIR=str(tmp_path / "spool"),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **extra,
    )
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    steps = command[command.index(str(LOOP)) + 1]  # train_loop.py STEPS WORKERS
    assert f"trained {steps}" in out.stdout
    return out


def _run(*flags: str, workers: int = 0) -> list[str]:
    return [sys.executable, "-m", "otelprof", "run", *flags, "--", sys.executable, str(LOOP), str(STEPS), str(workers)]


def _auto() -> list[str]:
    return [sys.executable, str(LOOP), str(STEPS), "0", "--auto"]


def _step_spans(rec: HttpReceiver) -> int:
    return sum(s.name == "train.step" for s in rec.spans)


def test_otelprof_run_says_once_where_spans_and_metrics_go(tmp_path: Path) -> None:
    """Two forked DataLoader workers: still one line. The URL's credentials (sent as a Basic
    authorization header) and query are not shown."""
    pytest.importorskip("torch")
    port = free_port()
    with http_receiver() as rec:
        out = _train(
            tmp_path,
            _run(workers=2),
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://alice:s3cret@127.0.0.1:{rec.port}/v1/traces?token=t0k",
            OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
        )
    assert _step_spans(rec) == STEPS  # the data went where the line says
    [line] = LINE.findall(out.stderr)
    spool = tmp_path / "spool"
    assert line == (
        f"otelprof: spans → http://127.0.0.1:{rec.port}/v1/traces?*** (http/protobuf) | spool {spool}; "
        f"metrics → http://127.0.0.1:{port}/metrics; "
        "windows: 2 steps of every 503 after the first 10, forever, an early one 10 steps in; "
        "on demand: POST /profile, SIGUSR2"
    )
    for secret in ("s3cret", "alice", "t0k"):
        assert secret not in out.stderr
    assert rec.headers_seen[0]["authorization"].startswith("Basic ")  # sent, never shown


@pytest.mark.slow  # a training subprocess; the otelprof run test stays in the fast loop
def test_import_otelprof_auto_without_endpoint_names_the_spool(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = _train(tmp_path, _auto(), OTEL_EXPORTER_PROMETHEUS_PORT="0", OTELPROF_PROFILE="false")
    [line] = LINE.findall(out.stderr)
    ports = re.findall(r"metrics → http://127\.0\.0\.1:(\d+)/metrics;", line)
    assert len(ports) == 1 and int(ports[0]) > 0  # the port 0 chose, not 0
    assert line.startswith(
        f"otelprof: spans → spool {tmp_path / 'spool'} (no OTEL_EXPORTER_OTLP_ENDPOINT; "
        "`otelprof spool replay` sends them); "
    )
    assert line.endswith("; windows: off (OTELPROF_PROFILE=false)")
    assert list((tmp_path / "spool").glob("*.otlp"))  # the spans are where it says


@pytest.mark.slow  # a training subprocess with a profiling window
def test_a_window_says_which_steps_it_profiled(tmp_path: Path) -> None:
    """One line per window of otelprof's own, once it is converted and sent: its steps, its
    trigger, the spans it sent (those the receiver got beside the step spans) and its raw trace."""
    pytest.importorskip("torch")
    with http_receiver() as rec:
        out = _train(
            tmp_path,
            [sys.executable, str(LOOP), "5", "0", "--auto"],
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{rec.port}",
            OTEL_EXPORTER_PROMETHEUS_PORT="0",
            OTELPROF_PROFILE_EARLY="0",
            OTELPROF_PROFILE_SKIP_FIRST="1",  # steps count from 0: steps 1 and 2
            OTELPROF_PROFILE_WAIT="0",
            OTELPROF_PROFILE_WARMUP="0",
            OTELPROF_PROFILE_ACTIVE="2",
            OTELPROF_PROFILE_REPEAT="1",
            OTELPROF_TRACE_DIR=str(tmp_path / "traces"),
        )
    lines = re.findall(r"^otelprof: profiled .*$", out.stderr, re.M)
    assert len(lines) == 1, out.stderr
    match = re.fullmatch(
        r"otelprof: profiled steps 1-2 \(schedule window\): (\d+) spans sent; raw trace (.+)", lines[0]
    )
    assert match, lines[0]
    step_family = {s.span_id for s in rec.spans if s.name == "train.step"}
    phase_names = ("data", "forward", "backward", "optimizer")  # "forward Sequential": the root module
    phases = sum(s.parent_span_id in step_family and s.name.split()[0] in phase_names for s in rec.spans)
    assert int(match.group(1)) == len(rec.spans) - len(step_family) - phases
    assert Path(match.group(2)).is_file()


@pytest.mark.slow  # training subprocesses
@pytest.mark.parametrize(
    ("how", "extra"),
    [
        ("run -q", {}),
        ("OTELPROF_QUIET", {"OTELPROF_QUIET": "TRUE"}),
        ("local rank 1", {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}),
        ("OTELPROF_ENABLED", {"OTELPROF_ENABLED": "false"}),
        ("OTEL_SDK_DISABLED", {"OTEL_SDK_DISABLED": "true"}),
    ],
)
def test_silent(tmp_path: Path, how: str, extra: dict[str, str]) -> None:
    pytest.importorskip("torch")
    command = _run("-q") if how == "run -q" else _auto()
    with http_receiver() as rec:
        out = _train(
            tmp_path,
            command,
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{rec.port}",
            OTELPROF_PROFILE="false",
            **extra,
        )
    assert "otelprof:" not in out.stderr, out.stderr
    instrumented = "ENABLED" not in how and "DISABLED" not in how
    assert _step_spans(rec) == (STEPS if instrumented else 0)  # silent, yet instrumented (or not)


def test_otlp_metrics_part() -> None:
    general = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://k:v@collector:4318/base/"}
    assert metrics_part({"otlp"}, "localhost", None, general) == (
        "metrics → https://***@collector:4318/base/v1/metrics (http/protobuf)"
    )
    specific = {**general, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4318/x?key=secret"}
    assert metrics_part({"otlp", "prometheus"}, "::1", 9465, specific, world_size=8) == (
        "metrics → http://[::1]:9465/metrics (each local rank: port + local rank) and "
        "http://m:4318/x?*** (http/protobuf)"
    )
    assert metrics_part({"otlp"}, "localhost", None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == (
        "metrics → http://localhost:4317 (grpc)"
    )
    assert (
        metrics_part({"prometheus"}, "localhost", None, {}) == "metrics → /metrics not served (see the warning above)"
    )
    assert metrics_part(set(), "localhost", None, {}) == "metrics → none (OTEL_METRICS_EXPORTER=none)"


def test_windows_part_follows_the_settings() -> None:
    env = {
        "OTELPROF_PROFILE_SKIP_FIRST": "5",
        "OTELPROF_PROFILE_WAIT": "0",
        "OTELPROF_PROFILE_WARMUP": "1",
        "OTELPROF_PROFILE_ACTIVE": "3",
        "OTELPROF_PROFILE_REPEAT": "1",
        "OTELPROF_PROFILE_EARLY": "10",  # does not fit before the schedule's window: left out
        "OTELPROF_TRIGGER_SIGNAL": "none",
        "OTELPROF_TRIGGER_FILE": "/tmp/go",
    }
    windows = settings_from_env(env).windows
    assert windows_part(windows, http_trigger=False) == (
        "windows: 3 steps of every 4 after the first 5, 1x; on demand: file /tmp/go"
    )


def test_the_demo_is_quiet_unless_asked() -> None:
    assert demo_environment({})["OTELPROF_QUIET"] == "true"
    assert demo_environment({"OTELPROF_QUIET": "false"})["OTELPROF_QUIET"] == "false"


@pytest.mark.slow  # a training subprocess
def test_the_demo_says_where_its_data_went_once(tmp_path: Path) -> None:
    """The demo prints where its data went itself: its training child does not say it too."""
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(OTELPROF_SPOOL_DIR=str(tmp_path / "spool"), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "otelprof", "demo", "--out", str(tmp_path / "demo")]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    printed = out.stdout + out.stderr
    assert "spans →" not in printed
    assert printed.count(f"kept in the spool {tmp_path / 'spool'}") == 1


def test_long_and_multiline_values_stay_one_short_line() -> None:
    windows = settings_from_env({"OTELPROF_TRIGGER_FILE": "/x/" + "a" * 100_000}).windows
    shown = windows_part(windows, http_trigger=True)
    assert shown.endswith("aaa... (100003 characters)") and len(shown) < 300
    multiline = metrics_part({"otlp"}, "h", None, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m/\nx"})
    assert multiline == "metrics → http://m/\\nx (http/protobuf)"


@pytest.mark.slow  # a training subprocess
@pytest.mark.parametrize(
    ("exporters", "spans"),
    [
        ("console", "spans → SDK exporters ConsoleSpanExporter;"),
        ("none", "spans → nowhere (OTEL_TRACES_EXPORTER=none);"),
        ("otlp,console", "(http/protobuf) | spool {spool} and SDK exporters ConsoleSpanExporter;"),
    ],
)
def test_the_line_names_the_sdk_exporters_that_get_the_spans(tmp_path: Path, exporters: str, spans: str) -> None:
    """OTEL_TRACES_EXPORTER decides where spans go (docs/opentelemetry-sdk.md): the line says so."""
    pytest.importorskip("torch")
    with http_receiver() as rec:
        out = _train(
            tmp_path,
            _auto(),
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{rec.port}",
            OTEL_TRACES_EXPORTER=exporters,
            OTEL_EXPORTER_PROMETHEUS_PORT="0",
            OTELPROF_PROFILE="false",
        )
    [line] = LINE.findall(out.stderr)
    assert spans.format(spool=tmp_path / "spool") in line, line
    assert _step_spans(rec) == (STEPS if "otlp" in exporters else 0)  # the OTLP path as the line says
    assert out.stdout.count('"name": "train.step"') == (STEPS if "console" in exporters else 0)
