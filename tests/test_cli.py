"""The ``otelprof`` command line, run in-process through ``main()`` and as ``python -m otelprof``."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof import __version__, convert
from otelprof._launch import main as launch_main
from otelprof.cli import build_parser, main
from otelprof.otlp.file import read_delimited_file
from otelprof.otlp.jsonl import json_to_request
from otelprof.resource import options_from_env

REPO_ROOT = Path(__file__).resolve().parents[1]
# Small shared traces (each converts in well under a second), by a unique part of the name.
CPU_ONLY = "cpu_only__rank-34"
ALEXNET = "critical_path__alexnet"
BERT_H100 = "h100__gaunernst_bert-small"
AMD_MI250 = "amd_trace__mi250"

FindTrace = Callable[[str], Path]
HEX32 = re.compile(r"[0-9a-f]{32}\Z")
HEX16 = re.compile(r"[0-9a-f]{16}\Z")


def _decode(requests: list[bytes]) -> list[ExportTraceServiceRequest]:
    return [ExportTraceServiceRequest.FromString(r) for r in requests]


def _span_count(requests: list[bytes]) -> int:
    return sum(len(ss.spans) for req in _decode(requests) for rs in req.resource_spans for ss in rs.scope_spans)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


# --- usage -------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--help"], ["convert", "--help"], ["demo", "--help"], ["doctor", "-h"], ["-h"]])
def test_help_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: otelprof")
    assert "exit codes:" in out


def _command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and sub-command of ``parser``: its argparse sub-parsers, walked."""
    paths = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _command_paths(sub, (*path, name))
    return paths


@pytest.mark.parametrize("path", _command_paths(build_parser()), ids=lambda path: " ".join(path) or "otelprof")
def test_every_command_and_sub_command_has_help(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    """Enumerated from the command line's own parser, so a new command or sub-command is covered;
    through the console script's function (``otelprof run`` parses its own arguments first)."""
    for flag in ("--help", "-h"):
        assert launch_main([*path, flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith(" ".join(("usage: otelprof", *path, "[-h]"))), out
        assert "-h, --help" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"otelprof {__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["convert", "x.json"],  # no -o
        ["convert", "-o", "out.bin"],  # no trace
        ["convert", "x.json", "-o", "o", "--detail", "most"],
        ["convert", "x.json", "-o", "o", "--max-request-bytes", "100"],
        ["convert", "x.json", "-o", "o", "--min-duration-us", "-1"],
        ["convert", "x.json", "-o", "o", "--engine", "gpu"],
        ["demo", "--steps", "0"],
        ["-q", "-v", "convert", "x.json", "-o", "o"],
        ["spool", "frob"],
        ["run", "--"],
        ["summary", "t.json", "--limit", "many"],
        ["summary", "t.json", "--sort", "fastest"],
        ["doctor", "extra"],
        ["doctor", "--format", "yaml"],
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert not any(tmp_path.iterdir()), "a usage error must not write anything"


# --- convert: otlp-proto -----------------------------------------------------------------


@pytest.mark.parametrize("name", [CPU_ONLY, ALEXNET, BERT_H100, AMD_MI250])
def test_convert_proto_matches_api(
    name: str, kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    trace = kineto_trace(name)
    out = tmp_path / "out.otlp"
    assert main(["-q", "convert", str(trace), "-o", str(out), "--engine", "reference"]) == 0

    requests = read_delimited_file(out)
    expected = convert(trace, options=options_from_env({}), engine="reference")
    assert requests == expected.requests
    assert _span_count(requests) == expected.stats["spans"] > 0
    assert len(requests) == expected.stats["requests"]
    for req in _decode(requests):
        scope = req.resource_spans[0].scope_spans[0].scope
        assert (scope.name, scope.version) == ("otelprof", __version__)


def test_convert_several_traces_into_one_file(
    kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = [kineto_trace(CPU_ONLY), kineto_trace(AMD_MI250)]
    out = tmp_path / "both.bin"
    assert main(["convert", *map(str, traces), "-o", str(out), "--engine", "reference"]) == 0

    results = [convert(t, options=options_from_env({}), engine="reference") for t in traces]
    assert read_delimited_file(out) == results[0].requests + results[1].requests
    lines = _error_lines(capsys.readouterr().err)
    assert len(lines) == 3  # one summary per trace, then the "wrote" line
    for trace, result, line in zip(traces, results, lines, strict=False):
        assert line.startswith(f"{trace}: {result.stats['spans']} spans, ")
        assert line.endswith("engine reference")
    assert lines[2].startswith(f"wrote {out}: ")


def test_convert_splits_requests_under_max_bytes(
    kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    trace = kineto_trace(ALEXNET)
    out = tmp_path / "out.bin"
    argv = ["-q", "convert", str(trace), "-o", str(out), "--engine", "reference", "--max-request-bytes", "20000"]
    assert main(argv) == 0
    requests = read_delimited_file(out)
    assert len(requests) > 1
    assert all(len(r) <= 20000 for r in requests)
    whole = convert(trace, options=options_from_env({}), engine="reference")
    assert _span_count(requests) == whole.stats["spans"]


def test_convert_options_from_env_and_flags(
    kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    trace = kineto_trace(BERT_H100)
    clean_env.setenv("OTEL_SERVICE_NAME", "trainer")
    clean_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,team=ml%20infra")
    clean_env.setenv("OTELPROF_DETAIL", "full")
    clean_env.setenv("OTELPROF_RUN_ID", "run-from-env")

    out = tmp_path / "env.bin"
    assert main(["-q", "convert", str(trace), "-o", str(out), "--engine", "reference"]) == 0
    full = convert(trace, engine="reference", detail="full", run_id="run-from-env", scope_version=__version__)
    requests = read_delimited_file(out)
    assert _span_count(requests) == full.stats["spans"]
    resource = {kv.key: kv.value.string_value for kv in _decode(requests)[0].resource_spans[0].resource.attributes}
    assert resource["service.name"] == "trainer"
    assert resource["deployment.environment"] == "ci"
    assert resource["team"] == "ml infra"
    assert resource["otelprof.run.id"] == "run-from-env"

    flagged = tmp_path / "flags.bin"
    argv = ["-q", "convert", str(trace), "-o", str(flagged), "--engine", "reference", "--detail", "default"]
    assert main([*argv, "--run-id", "run-from-flag"]) == 0
    default = convert(trace, engine="reference", run_id="run-from-flag")
    assert _span_count(read_delimited_file(flagged)) == default.stats["spans"] < full.stats["spans"]
    resource = {
        kv.key: kv.value.string_value
        for kv in _decode(read_delimited_file(flagged))[0].resource_spans[0].resource.attributes
    }
    assert resource["otelprof.run.id"] == "run-from-flag"


def test_convert_to_stdout(
    kineto_trace: FindTrace, clean_env: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    trace = kineto_trace(CPU_ONLY)
    assert main(["-q", "convert", str(trace), "-o", "-", "--engine", "reference", "--format", "otlp-json"]) == 0
    captured = capsysbinary.readouterr()
    assert captured.err == b""
    lines = captured.out.decode("utf-8").splitlines()
    assert [json_to_request(line) for line in lines] == convert(
        trace, options=options_from_env({}), engine="reference"
    ).requests


# --- convert: otlp-json ------------------------------------------------------------------


@pytest.mark.parametrize("suffix, fmt", [(".jsonl", []), (".out", ["--format", "otlp-json"])])
def test_convert_json(
    suffix: str, fmt: list[str], kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    trace = kineto_trace(AMD_MI250)  # has fwdbwd flows, so links
    out = tmp_path / f"out{suffix}"
    assert main(["-q", "convert", str(trace), "-o", str(out), "--engine", "reference", *fmt]) == 0
    expected = convert(trace, options=options_from_env({}), engine="reference")

    text = out.read_text("utf-8")
    assert text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == len(expected.requests)
    spans = links = 0
    for line in lines:
        doc = json.loads(line)
        assert line == json.dumps(doc, separators=(",", ":"), ensure_ascii=False), "compact, one line"
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    spans += 1
                    assert HEX32.match(span["traceId"]), span["traceId"]
                    assert HEX16.match(span["spanId"]), span["spanId"]
                    assert "parentSpanId" not in span or HEX16.match(span["parentSpanId"])
                    assert span["kind"] == 1  # enums are integers in OTLP/JSON
                    assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"]) > 0
                    for link in span.get("links", ()):
                        links += 1
                        assert HEX32.match(link["traceId"]) and HEX16.match(link["spanId"])
    assert spans == expected.stats["spans"]
    assert links == expected.stats["links"] > 0
    # Decoding the JSON gives back exactly the protobuf requests.
    assert [json_to_request(line) for line in lines] == expected.requests


def test_json_ids_are_the_protobuf_ids(kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    trace = kineto_trace(CPU_ONLY)
    out = tmp_path / "out.jsonl"
    assert main(["-q", "convert", str(trace), "-o", str(out), "--engine", "reference"]) == 0
    expected = _decode(convert(trace, options=options_from_env({}), engine="reference").requests)
    pb_ids = [
        (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex())
        for req in expected
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    json_ids = [
        (s["traceId"], s["spanId"], s.get("parentSpanId", ""))
        for line in out.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    assert json_ids == pb_ids
    assert any(parent for _, _, parent in json_ids)


# --- convert: errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b'{"traceEvents": [', b"not json at all", b"\x1f\x8b\x08\x00garbage", b"", b"[1, 2, 3]"],
    ids=["truncated", "text", "bad-gzip", "empty", "not-an-object"],
)
def test_bad_trace_exits_1_with_one_line(
    content: bytes, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    out = tmp_path / "out.bin"
    out.write_bytes(b"previous")
    assert main(["convert", str(bad), "-o", str(out), "--engine", "reference"]) == 1
    captured = capsys.readouterr()
    lines = _error_lines(captured.err)
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"otelprof: error: {bad}: ")
    assert out.read_bytes() == b"previous", "a failed conversion leaves the output untouched"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "out.bin"], "no temporary file left"


def test_one_bad_trace_fails_the_whole_output(
    kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.bin"
    missing = tmp_path / "missing.json.gz"
    assert (
        main(["-q", "convert", str(kineto_trace(CPU_ONLY)), str(missing), "-o", str(out), "--engine", "reference"]) == 1
    )
    lines = _error_lines(capsys.readouterr().err)
    assert len(lines) == 1
    assert lines[0].startswith(f"otelprof: error: {missing}: cannot read trace")
    assert not out.exists()


def test_unwritable_output_exits_1(
    kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no" / "such" / "dir" / "out.bin"
    assert main(["-q", "convert", str(kineto_trace(CPU_ONLY)), "-o", str(out), "--engine", "reference"]) == 1
    lines = _error_lines(capsys.readouterr().err)
    assert len(lines) == 1
    assert lines[0].startswith("otelprof: error: ") and "No such file or directory" in lines[0]


def test_quiet_prints_nothing(
    kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.bin"
    assert main(["convert", "-q", str(kineto_trace(CPU_ONLY)), "-o", str(out), "--engine", "reference"]) == 0
    assert capsys.readouterr() == ("", "")
    assert out.stat().st_size > 0


def test_verbose_logs_stats(
    kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = kineto_trace(CPU_ONLY)
    assert main(["-v", "convert", str(trace), "-o", str(tmp_path / "o.bin"), "--engine", "reference"]) == 0
    err = capsys.readouterr().err
    assert f"otelprof: info: {trace}: stats {{'events_total': " in err


# --- as a program ------------------------------------------------------------------------


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        timeout=300,
        check=False,
    )


def test_python_m_otelprof() -> None:
    proc = _run("-m", "otelprof", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: otelprof")
    proc = _run("-m", "otelprof", "convert")
    assert proc.returncode == 2
    assert "the following arguments are required" in proc.stderr


COMMANDS = [path[0] for path in _command_paths(build_parser()) if len(path) == 1]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_exit_codes_and_verbosity(command: str) -> None:
    proc = _run("-m", "otelprof", command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: otelprof {command}")
    assert "exit codes:" in proc.stdout
    assert "-q, --quiet" in proc.stdout and "-v, --verbose" in proc.stdout


def test_top_level_help_and_error_name_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"    {command} " in out for command in COMMANDS)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert all(command in err.splitlines()[-1] for command in COMMANDS)


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["convert"],
        ["demo", "--steps", "0"],
        ["spool"],
        ["run"],
        ["summary"],
        ["doctor", "--timeout", "0"],
        ["import"],
    ],
)
def test_usage_errors_exit_2_as_a_program(argv: list[str]) -> None:
    proc = _run("-m", "otelprof", *argv)
    assert proc.returncode == 2, (argv, proc.stderr)
    assert "error:" in proc.stderr
    assert proc.stdout == ""


def test_run_takes_its_flags_before_the_separator() -> None:
    env = {"OTELPROF_ENABLED": "false"}
    script = "import sys; print(sys.argv[1:]); sys.exit(3)"
    proc = _run("-m", "otelprof", "run", "-q", "--", sys.executable, "-c", script, "-q", "--verbose", env=env)
    assert proc.returncode == 3, proc.stderr  # the command's own exit status
    assert proc.stdout.strip() == "['-q', '--verbose']"  # after --, flags belong to the command
    proc = _run("-m", "otelprof", "run", "--", "otelprof-no-such-command", env=env)
    assert proc.returncode == 127
    assert proc.stderr.strip() == "otelprof: error: otelprof-no-such-command: command not found"


#: What the command line must not import where it does not use it (issue 18: start-up): the
#: exporter's transports and metrics, torch, and protobuf's message classes (OTLP/JSON only).
_HEAVY = ("grpc", "prometheus_client", "torch", "google.protobuf", "opentelemetry.proto", "sqlite3")


def _imported_heavy(argv: list[str]) -> list[str]:
    """The _HEAVY modules that ``otelprof ARGV`` (its console script's function, in a fresh
    interpreter) imported, after checking that it exited 0."""
    code = (
        "import json, sys; from otelprof._launch import main; "
        f"rc = main({argv!r}); "
        f"print(json.dumps([m for m in {_HEAVY!r} if m in sys.modules])); sys.exit(rc)"
    )
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr
    heavy: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return heavy


def test_version_imports_nothing_heavy() -> None:
    assert _imported_heavy(["--version"]) == []


def test_convert_imports_only_what_it_uses(kineto_trace: FindTrace, tmp_path: Path) -> None:
    trace = str(kineto_trace(CPU_ONLY))
    # a small trace to a protobuf file: no grpc, prometheus-client, torch, nor protobuf's classes
    assert _imported_heavy(["-q", "convert", trace, "-o", str(tmp_path / "o.bin")]) == []
    # OTLP/JSON is written through protobuf's json_format: that, and still nothing else
    heavy = _imported_heavy(["-q", "convert", trace, "-o", str(tmp_path / "o.jsonl")])
    assert "grpc" not in heavy and "prometheus_client" not in heavy and "torch" not in heavy
    assert "google.protobuf" in heavy


def test_demo_without_torch_exits_1(tmp_path: Path) -> None:
    # sys.modules["torch"] = None makes `import torch` fail exactly as when it is not installed.
    code = (
        "import sys; sys.modules['torch'] = None; from otelprof.cli import main; "
        f"sys.exit(main(['demo', '--out', {str(tmp_path / 'demo')!r}]))"
    )
    proc = _run("-c", code)
    assert proc.returncode == 1
    lines = _error_lines(proc.stderr)
    assert len(lines) == 1
    assert lines[0].startswith("otelprof: error: ") and "pip install torch" in lines[0]
    assert not (tmp_path / "demo" / "summary.json").exists()


def test_bad_environment_warns_and_converts(
    kineto_trace: FindTrace, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=ml,oops")
    clean_env.setenv("OTELPROF_DETAIL", "everything")
    trace = kineto_trace(CPU_ONLY)
    out = tmp_path / "o.bin"
    assert main(["convert", str(trace), "-o", str(out), "--engine", "reference"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("otelprof: warning: ")]
    assert sorted(warnings) == [
        "otelprof: warning: OTELPROF_DETAIL='everything' is not 'full' or 'default'; using 'default'",
        "otelprof: warning: OTEL_RESOURCE_ATTRIBUTES: ignoring invalid entry 'oops' (no '=')",
    ]
    expected = convert(trace, engine="reference", resource_attributes=(("team", "ml"),), scope_version=__version__)
    assert read_delimited_file(out) == expected.requests
