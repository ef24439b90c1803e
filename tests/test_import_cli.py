"""``otelprof import`` as a command: help, progress line, summary, no torch needed."""

from __future__ import annotations

import calendar
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from converter_helpers import shared_trace
from export.receivers import http_receiver
from importer.helpers import import_env, run_import
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otelprof.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_help_documents_exit_codes_and_resume(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", "--help"]) == 0
    out = capsys.readouterr().out
    for text in ("--resume", "--ledger", "--progress", "130", "~/.cache/otelprof/imports", "Nsight Systems"):
        assert text in out


def test_progress_line_only_when_asked_off_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = shared_trace("alexnet")
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        assert run_import(trace, "--ledger", tmp_path / "a.json") == 0
        plain = capsys.readouterr().err
        assert run_import(trace, "--ledger", tmp_path / "b.json", "--progress") == 0
        shown = capsys.readouterr().err
    assert "\r" not in plain and "events/s" in plain  # the summary line
    assert plain.startswith("imported 1 of 1 files: 1,408 events as 523 spans in 1 requests")
    assert f"1 requests sent to http://127.0.0.1:{rec.port}/v1/traces" in plain
    assert "\rimport [####################] 100%  1/1 files  1,408 events" in shown


def test_import_needs_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None; from otelprof.cli import main; "
        f"sys.exit(main(['-q', 'import', {str(shared_trace('cpu_only'))!r}, '--ledger', {str(tmp_path / 'l.json')!r}]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(PYTHONPATH=str(ROOT), OTELPROF_SPOOL_DIR=str(tmp_path / "spool"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "spool").glob("*.otlp"))) == 1


def test_export_disabled_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with import_env(tmp_path, None), pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_SDK_DISABLED", "true")
        assert run_import(shared_trace("cpu_only")) == 1
    assert "OTEL_SDK_DISABLED" in capsys.readouterr().err


# --- findable imports: the time range of what was sent, and how to see it ------------------

_RANGE = re.compile(r"^spans sent: from (\S+) to (\S+) \(UTC\), (.+) ago$", re.M)
_IDS = re.compile(r"look up a trace id: ([0-9a-f, ]+)$", re.M)


def _ns(iso: str) -> int:
    """``2023-09-27T17:25:35.123456789Z`` back to Unix nanoseconds."""
    whole, fraction = iso.removesuffix("Z").split(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) * 1_000_000_000 + int(fraction)


def _printed(err: str) -> tuple[int, int, str, list[bytes]]:
    [(start, end, ago)] = _RANGE.findall(err)
    [ids] = _IDS.findall(err)
    return _ns(start), _ns(end), ago, [bytes.fromhex(t) for t in ids.split(", ")]


def _first_traces(spans: list[Span], n: int = 3) -> list[bytes]:
    out: list[bytes] = []
    for span in spans:
        if span.trace_id not in out and len(out) < n:
            out.append(span.trace_id)
    return out


def test_the_time_range_sent_to_a_receiver_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = shared_trace("alexnet")
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        assert run_import(trace, "--ledger", tmp_path / "a.json") == 0
    err = capsys.readouterr().err
    start, end, ago, ids = _printed(err)
    spans = rec.spans
    assert (start, end) == (min(s.start_time_unix_nano for s in spans), max(s.end_time_unix_nano for s in spans))
    assert ago.endswith("years")  # recorded in 2023: a UI's default last hours shows none of it
    assert ids == _first_traces(spans)
    assert "Jaeger" in err and "Grafana Tempo" in err and "Phoenix" in err and "MLflow" in err
    assert f"from={start // 1_000_000}&to={-(-end // 1_000_000)}" in err  # Grafana's range, in ms


def test_the_time_range_spans_every_file_spooled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two files recorded two years apart, no endpoint: the range covers both, as spooled."""
    traces = [shared_trace("alexnet"), shared_trace("resnet50_num_workers_0__worker0.16")]
    with import_env(tmp_path, None):
        assert run_import(*traces, "--ledger", tmp_path / "a.json") == 0
    start, end, _ago, ids = _printed(capsys.readouterr().err)
    spans = [
        s
        for record in sorted((tmp_path / "spool").glob("*.otlp"))
        for rs in ExportTraceServiceRequest.FromString(record.read_bytes()).resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    assert (start, end) == (min(s.start_time_unix_nano for s in spans), max(s.end_time_unix_nano for s in spans))
    assert end - start > 365 * 86400 * 10**9  # 2021's ResNet and 2023's AlexNet
    assert ids == _first_traces(spans)


def test_nothing_sent_prints_no_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = shared_trace("cpu_only")
    with import_env(tmp_path, None):
        assert run_import(trace, "--ledger", tmp_path / "a.json") == 0
        capsys.readouterr()
        assert run_import(trace, "--ledger", tmp_path / "a.json", "--resume") == 0  # all in the ledger
    err = capsys.readouterr().err
    assert "already imported" in err and not _RANGE.search(err)


@pytest.mark.parametrize("fragment", ["alexnet", "resnet50_num_workers_0__worker0.16", "nccl_data"])
def test_the_dating_reads_what_a_whole_decode_reads(fragment: str) -> None:
    """``span_times`` skips every field but three: its times and trace ids are a whole decode's."""
    from otelprof import ConvertOptions, convert
    from otelprof.importer.session import span_times

    result = convert(shared_trace(fragment), options=ConvertOptions(detail="full", max_request_bytes=64 * 1024))
    assert len(result.requests) > 1
    for request in result.requests:
        spans = [
            s
            for rs in ExportTraceServiceRequest.FromString(request).resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]
        times = span_times(request, 3)
        assert times is not None
        assert times.start_ns == min(s.start_time_unix_nano for s in spans)
        assert times.end_ns == max(s.end_time_unix_nano for s in spans)
        assert list(times.trace_ids) == _first_traces(spans)
        assert span_times(request).trace_ids == ()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("env", "service"),
    [
        ({}, "otelprof-import"),
        ({"OTEL_SERVICE_NAME": "trainer"}, "trainer"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "team=ml,service.name=bench%20job"}, "bench job"),
    ],
)
def test_imports_name_their_service(tmp_path: Path, env: dict[str, str], service: str) -> None:
    """Not the SDK's unknown_service: a backend's service list shows otelprof-import, unless the
    user named the service."""
    with http_receiver() as rec, import_env(tmp_path, rec.port), pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        assert run_import(shared_trace("cpu_only"), "--ledger", tmp_path / "a.json") == 0
    resources = [rs.resource for r in rec.requests for rs in r.resource_spans]
    assert resources
    for resource in resources:
        names = [kv.value.string_value for kv in resource.attributes if kv.key == "service.name"]
        assert names == [service]
    if "OTEL_RESOURCE_ATTRIBUTES" in env:
        assert all(any(kv.key == "team" and kv.value.string_value == "ml" for kv in r.attributes) for r in resources)
