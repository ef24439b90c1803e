"""Issue 15, item 5: the command line as a new user meets it, run as a user runs it
(``python -m otelprof``, real files, real receivers). Each test failed before its fix."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import pytest
from conftest import SHARED_TRACES as SHARED
from export.receivers import http_receiver
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof.cli import build_parser
from otelprof.export.config import exporter_config_from_env
from otelprof.export.destination import NO_DESTINATION, destination_id
from otelprof.export.spool import Spool, record_destination

REPO_ROOT = Path(__file__).resolve().parents[1]
CPU_ONLY = "cpu_only__rank-34"
ALEXNET = "critical_path__alexnet"
GARBAGE = "OTEL_EXPORTER_OTLP_ENDPOINT='garbage' is not an http(s) URL"


def _shared(folder: str, part: str) -> Path:
    matches = [p for p in sorted((SHARED / folder).glob("*")) if part in p.name]
    if len(matches) != 1:
        pytest.skip(f"shared trace {part!r} not found under {SHARED / folder}")
    return matches[0]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(OTELPROF_SPOOL_DIR=str(tmp_path / "spool"), HOME=str(tmp_path / "home"), **extra)
    return env


def _otelprof(*args: str, env: dict[str, str], cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otelprof", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
        check=False,
    )


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# --- summary of a trace folder ----------------------------------------------------------------


def test_summary_reads_a_folder_of_traces_as_import_finds_them(tmp_path: Path) -> None:
    cpu, alexnet = _shared("kineto", CPU_ONLY), _shared("kineto", ALEXNET)
    folder = tmp_path / "traces"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(cpu, folder / cpu.name)
    shutil.copy(alexnet, folder / "sub" / alexnet.name)
    (folder / "config.json").write_text('{"lr": 0.1}')  # not a trace: skipped, as import skips it
    env = _env(tmp_path)
    by_files = _otelprof("summary", "--format", "json", str(cpu), str(alexnet), env=env)
    assert by_files.returncode == 0, by_files.stderr
    by_folder = _otelprof("summary", "--format", "json", "-v", f"{folder}/", env=env)
    assert by_folder.returncode == 0, by_folder.stderr
    got, want = json.loads(by_folder.stdout), json.loads(by_files.stdout)
    assert got["rows"] == want["rows"] and len(got["rows"]) > 10
    assert f"{folder / 'config.json'}: skipped, a JSON file without traceEvents" in by_folder.stderr


def test_summary_of_a_folder_without_traces_or_records_says_what_it_looked_for(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = _otelprof("summary", str(tmp_path / "empty"), env=_env(tmp_path))
    assert proc.returncode == 1
    assert _lines(proc.stderr) == [
        f"otelprof: error: {tmp_path / 'empty'}: no traces found (*.json, *.json.gz, *.sqlite, nvprof *.nvvp); "
        "nor spooled requests (*.otlp)"
    ]


# --- an Nsight Systems export given to convert or summary --------------------------------------


@pytest.mark.parametrize("command", ["convert", "summary"])
def test_an_nsys_sqlite_export_points_at_import(command: str, tmp_path: Path) -> None:
    sqlite = _shared("nsys", "saxpy")
    out = tmp_path / "out.otlp"
    args = ["convert", str(sqlite), "-o", str(out)] if command == "convert" else ["summary", str(sqlite)]
    proc = _otelprof(*args, env=_env(tmp_path))
    assert proc.returncode == 1
    assert _lines(proc.stderr) == [
        f"otelprof: error: {sqlite}: a SQLite database (an Nsight Systems export?), not a Kineto trace: "
        f"`otelprof import {sqlite}` sends an nsys export as spans"
    ]
    assert not out.exists() and not list(tmp_path.glob(".out.otlp*"))


def test_summary_of_a_folder_of_nsys_exports_points_at_import(tmp_path: Path) -> None:
    folder = tmp_path / "nsys"
    folder.mkdir()
    shutil.copy(_shared("nsys", "saxpy"), folder / "run.sqlite")
    proc = _otelprof("summary", str(folder), env=_env(tmp_path))
    assert proc.returncode == 1
    assert _lines(proc.stderr) == [
        f"otelprof: error: {folder}: only Nsight Systems exports here, no Kineto traces: `otelprof import {folder}`"
    ]


# --- an endpoint that is not a URL ---------------------------------------------------------------


def test_an_invalid_endpoint_is_one_warning_then_the_spool_everywhere(tmp_path: Path) -> None:
    trace = _shared("kineto", CPU_ONLY)
    env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="garbage")
    proc = _otelprof("import", str(trace), env=env)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in _lines(proc.stderr) if GARBAGE in line and line.startswith("otelprof:")]
    assert warnings == [f"otelprof: warning: {GARBAGE}; ignored: spans go to the spool, as with no endpoint"]
    assert f"(no OTLP endpoint configured: {GARBAGE})" in proc.stderr
    records = Spool(tmp_path / "spool").records()
    assert records and {record_destination(r) for r in records} == {NO_DESTINATION}

    doctor = _otelprof("doctor", "--no-torch", env=env)
    out = doctor.stdout + doctor.stderr
    assert out.count(GARBAGE) == 2, out  # the configuration check, and the export check saying why
    assert f"[warn] config: {GARBAGE}; ignored: spans go to the spool, as with no endpoint" in out
    assert f"[warn] export: no endpoint: {GARBAGE}, so spans only go to the spool" in out
    assert "  OTEL_EXPORTER_OTLP_ENDPOINT=garbage" in doctor.stdout.splitlines()
    assert "localhost:431" not in out  # no default endpoint is claimed, or used


def test_doctor_lists_the_endpoint_default_the_docs_state(tmp_path: Path) -> None:
    proc = _otelprof("doctor", "--no-torch", env=_env(tmp_path))
    assert "  OTEL_EXPORTER_OTLP_ENDPOINT unset (default: none, spans go to the spool)" in proc.stdout.splitlines()
    exporting = (REPO_ROOT / "docs" / "exporting.md").read_text()
    assert "| `OTEL_EXPORTER_OTLP_ENDPOINT` | unset: spool only (" in exporting


@pytest.mark.parametrize(
    ("value", "protocols"),
    [
        ("garbage", ("http/protobuf",)),  # for gRPC a host without a scheme is valid
        ("ftp://collector:4318", ("grpc", "http/protobuf")),
        ("http://collector:port", ("grpc", "http/protobuf")),
    ],
)
def test_invalid_endpoints_read_as_unset(
    value: str, protocols: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    for protocol in protocols:
        caplog.clear()
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": value, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
        cfg = exporter_config_from_env(env)
        assert not cfg.endpoint_configured and destination_id(cfg) == NO_DESTINATION
        assert [r.getMessage() for r in caplog.records] == [
            f"OTEL_EXPORTER_OTLP_ENDPOINT={value!r} is not an http(s) URL; ignored: spans go to the spool, "
            "as with no endpoint"
        ]


# --- -q / -v after every command name -----------------------------------------------------------


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    return [leaf for name, child in subs[0].choices.items() for leaf in _leaves(child, (*path, name))]


def test_quiet_and_verbose_work_after_every_command_name() -> None:
    leaves = _leaves(build_parser())
    assert ("spool", "drop") in [path for path, _ in leaves]
    for path, parser in leaves:
        assert {"-q", "--quiet", "-v", "--verbose"} <= set(parser._option_string_actions), path


def test_spool_drop_and_ls_take_q_and_v_after_the_action(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    for _ in range(2):
        spool.write(ExportTraceServiceRequest().SerializeToString() + b"\x0a\x00")
    env = _env(tmp_path)
    listed = _otelprof("spool", "ls", "-q", env=env)
    assert listed.returncode == 0 and listed.stderr == "" and len(_lines(listed.stdout)) == 2
    dropped = _otelprof("spool", "drop", "-q", env=env)
    assert (dropped.returncode, dropped.stdout, dropped.stderr) == (0, "", "")
    assert spool.records() == []
    again = _otelprof("spool", "drop", "-v", env=env)
    assert again.returncode == 0 and _lines(again.stderr) == [f"0 requests dropped from {tmp_path / 'spool'}"]


# --- one log format, each warning once ------------------------------------------------------------


_LIVE = """
import logging, sys
if sys.argv[1] == "app-logging":
    logging.basicConfig(format="APP %(name)s %(message)s")
import torch, otelprof
otelprof.instrument()
model = torch.nn.Linear(4, 2)
for _ in range(3):
    with otelprof.step_scope():
        model(torch.ones(2, 4)).sum().backward()
otelprof.uninstrument()
"""


@pytest.mark.slow  # torch training subprocesses
def test_live_warnings_have_the_otelprof_prefix_unless_the_app_configured_logging(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = _env(
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT="garbage",
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_EXPORTER_PROMETHEUS_PORT="0",
    )
    plain = subprocess.run(
        [sys.executable, "-c", _LIVE, "plain"], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert plain.returncode == 0, plain.stderr
    assert [line for line in _lines(plain.stderr) if GARBAGE in line] == [
        f"otelprof: warning: {GARBAGE}; ignored: spans go to the spool, as with no endpoint"
    ]
    app = subprocess.run(
        [sys.executable, "-c", _LIVE, "app-logging"], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert app.returncode == 0, app.stderr
    assert [line for line in _lines(app.stderr) if GARBAGE in line] == [
        f"APP otelprof.export.config {GARBAGE}; ignored: spans go to the spool, as with no endpoint"
    ]


# --- import: replayed requests, skipped files -----------------------------------------------------


def test_import_reports_the_spooled_requests_it_replayed(tmp_path: Path) -> None:
    trace = _shared("kineto", CPU_ONLY)
    with http_receiver() as rec:
        env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{rec.port}")
        cfg = exporter_config_from_env(env)
        older = ExportTraceServiceRequest()
        older.resource_spans.add().scope_spans.add().spans.add(name="older", trace_id=b"\1" * 16, span_id=b"\2" * 8)
        spool = Spool(tmp_path / "spool")
        for _ in range(3):  # spooled by an earlier job for this very destination
            spool.write(older.SerializeToString(), destination=destination_id(cfg))
        proc = _otelprof("import", str(trace), env=env)
        assert proc.returncode == 0, proc.stderr
        names = [s.name for r in rec.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert names.count("older") == 3
    [summary] = [line for line in _lines(proc.stderr) if line.startswith("imported 1 of 1 files")]
    new = len(rec.requests) - 3
    assert f"; {new} requests sent to http://127.0.0.1:{rec.port}/v1/traces;" in summary
    assert summary.endswith(f"; also 3 spooled requests replayed there from {tmp_path / 'spool'}")
    assert spool.records() == []


def test_import_verbose_names_the_files_it_skipped(tmp_path: Path) -> None:
    trace = _shared("kineto", CPU_ONLY)
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(trace, folder / trace.name)
    (folder / "metrics.json").write_text('{"loss": [1.0, 0.5]}')
    (folder / "notes.txt").write_text("lr 0.1")
    proc = _otelprof("import", "-v", str(folder), env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = _lines(proc.stderr)
    assert (
        f"otelprof: info: {folder / 'metrics.json'}: skipped, a JSON file without traceEvents (not a Kineto trace)"
        in lines
    )
    assert f"otelprof: info: {folder / 'notes.txt'}: skipped, not a trace file (*.json, *.json.gz, *.sqlite)" in lines
    quiet = _otelprof("import", "--resume", str(folder), env=_env(tmp_path))
    assert "skipped," not in quiet.stderr  # only with -v


# --- convert into a folder that does not exist ------------------------------------------------------


def test_convert_error_names_the_output_path_given(tmp_path: Path) -> None:
    trace = _shared("kineto", CPU_ONLY)
    out = tmp_path / "nonexistent" / "x.otlp"
    proc = _otelprof("convert", str(trace), "-o", str(out), env=_env(tmp_path))
    assert proc.returncode == 1
    assert _lines(proc.stderr) == [f"otelprof: error: {out}: No such file or directory"]
    (tmp_path / "isdir.otlp").mkdir()  # the rename fails: the same, about the path given
    proc = _otelprof("convert", str(trace), "-o", "isdir.otlp", "-q", env=_env(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1
    assert _lines(proc.stderr) == ["otelprof: error: isdir.otlp: Is a directory"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# --- the torch extra ---------------------------------------------------------------------------------


def test_the_torch_extra_brings_numpy() -> None:
    """Without numpy, ``import torch`` prints "Failed to initialize NumPy" on a new user's
    first screen."""
    extras = [r.replace(" ", "") for r in requires("otelprof") or []]
    assert [r for r in extras if r.startswith("numpy") and 'extra=="torch"' in r]


# --- doctor's spool check ---------------------------------------------------------------------------


def test_doctor_spool_counts_per_destination(tmp_path: Path) -> None:
    with http_receiver() as rec:
        env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{rec.port}")
        here = destination_id(exporter_config_from_env(env))
        other = destination_id(exporter_config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://elsewhere:4318"}))
        spool = Spool(tmp_path / "spool")
        for destination, n in ((here, 2), (other, 3), (NO_DESTINATION, 1)):
            for _ in range(n):
                spool.write(b"\x0a\x00", destination=destination)
        proc = _otelprof("doctor", "--no-torch", env=env)
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("[warn] spool:")]
    assert line == (
        f"[warn] spool: {tmp_path / 'spool'}: 6 requests (12 bytes) waiting: "
        "2 for this endpoint (a job exporting there replays them once it answers); "
        "1 naming no destination (spooled with no endpoint set, or by an older otelprof): no job replays them, "
        "`otelprof spool replay` sends them; "
        f"3 for 1 other destination(s) ({other}: `otelprof spool replay --destination ID` sends them)"
    )
    assert "the exporter replays them" not in proc.stdout
