"""``otelprof summary``: torch's key_averages() table, from traces and from a spool.

Held to three independent references: torch's own ``key_averages()`` on profiles recorded here,
kernel durations summed straight from the shared GPU traces' JSON, and the trace-file table
itself for the same trace shipped through a spool as OTLP spans.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import KINETO_DIR
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof import convert
from otelprof.cli import main
from otelprof.export.spool import Spool

REPO_ROOT = Path(__file__).resolve().parents[1]
FindTrace = Callable[[str], Path]
ALEXNET = "critical_path__alexnet"
BERT_H100 = "h100__gaunernst_bert-small"  # with_stack: python frames around the steps
DLRM_RANK0 = "dlrm_kineto__worker0"  # world size 8: operators in per-rank detail traces
AMD_MI250 = "amd_trace__mi250"
CPU_ONLY = "cpu_only__rank-34"
MI300 = "mi300__ddp_resnet18"  # no steps: iteration traces, python frames around them in the window


def _summary_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["summary", *argv, "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _rows(doc: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(r["name"], r["kind"], r["input_shapes"]): r for r in doc["rows"]}


# --- against torch's own key_averages() --------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow
def test_table_values_equal_torch_key_averages(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from torch_recordings import recorded

    rec = recorded(tmp_path_factory, "transformer_adamw")
    doc = _summary_json(capsys, str(rec.path))
    ours = {(r["name"], r["kind"]): r for r in doc["rows"] if r["kind"] != "device"}
    rec.key_averages.table(row_limit=-1)  # torch fills in each row's percentages while printing
    theirs = [evt for evt in rec.key_averages if evt.key != "[memory]"]
    assert len(theirs) > 20 and len(ours) == len(theirs) == doc["rows_total"]
    torch_self_total = sum(evt.self_cpu_time_total for evt in rec.key_averages)
    assert doc["self_cpu_total_ns"] / 1000 == pytest.approx(torch_self_total, abs=0.5 * len(theirs))
    for evt in theirs:
        row = ours[(evt.key, "annotation" if evt.is_user_annotation else "op")]
        assert row["calls"] == evt.count, evt.key
        assert row["self_cpu_ns"] / 1000 == pytest.approx(evt.self_cpu_time_total, abs=1.0), evt.key
        assert row["cpu_total_ns"] / 1000 == pytest.approx(evt.cpu_time_total, abs=max(1, evt.count)), evt.key
        assert row["self_cpu_percent"] == pytest.approx(float(evt.self_cpu_percent.rstrip("%")), abs=0.011), evt.key
        assert row["cpu_total_percent"] == pytest.approx(float(evt.total_cpu_percent.rstrip("%")), abs=0.011), evt.key
        assert row["self_device_ns"] == row["device_total_ns"] == 0


@pytest.mark.torch
@pytest.mark.slow
def test_group_by_input_shape_equals_torch(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from torch_recordings import recorded

    rec = recorded(tmp_path_factory, "transformer_adamw")
    ours = _rows(_summary_json(capsys, str(rec.path), "--group-by-input-shape"))
    theirs = [evt for evt in rec.key_averages_by_shape if evt.key != "[memory]"]
    assert len(ours) == len(theirs)
    assert len({r[2] for r in ours}) > 10, "several distinct shapes"
    compared = 0
    for evt in theirs:
        shapes = json.dumps(evt.input_shapes, separators=(",", ":"))
        row = ours.get((evt.key, "annotation" if evt.is_user_annotation else "op", "" if shapes == "[]" else shapes))
        if row is None:  # torch shows tensor lists as [] where the trace has their shapes
            assert any("[[" in key[2] for key in ours if key[0] == evt.key), evt.key
            continue
        compared += 1
        assert row["calls"] == evt.count
        assert row["self_cpu_ns"] / 1000 == pytest.approx(evt.self_cpu_time_total, abs=1.0)
    assert compared > 0.9 * len(theirs)


# --- GPU traces: self device time of an op = its kernels' time --------------------------

DEVICE_CATEGORIES = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
RUNTIME_CATEGORIES = {"cuda_runtime", "Runtime", "cuda_driver"}
OP_CATEGORIES = {"cpu_op", "Operator", "user_annotation", "python_function"}


def _ns(value: Decimal) -> int:
    return int((value * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def _kernel_time_by_launching_op(path: Path) -> dict[str, int]:
    """Straight from the JSON: each kernel/memcpy/memset's duration goes to the innermost
    operator, annotation or python frame on its runtime call's thread that encloses that call
    (torch's nesting: the later event in the file is inner when two have the same span)."""
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw, parse_float=Decimal)
    events = [e for e in (doc["traceEvents"] if isinstance(doc, dict) else doc) if e.get("ph") == "X"]
    launches: dict[int, tuple[Any, Any, int, int, str]] = {}
    ops: dict[tuple[Any, Any], list[tuple[int, int, int, str]]] = defaultdict(list)
    for index, e in enumerate(events):
        start = _ns(Decimal(e["ts"]))
        end = start + _ns(Decimal(e["dur"]))
        if e.get("cat") in RUNTIME_CATEGORIES and "correlation" in e.get("args", {}):
            launches.setdefault(int(e["args"]["correlation"]), (e["pid"], e["tid"], start, end, e["name"]))
        elif e.get("cat") in OP_CATEGORIES:
            name = "ProfilerStep*" if e["name"].startswith("ProfilerStep#") else e["name"]
            ops[(e["pid"], e["tid"])].append((start, -end, index, name))
    for thread_ops in ops.values():
        thread_ops.sort()
    starts = {thread: [op[0] for op in thread_ops] for thread, thread_ops in ops.items()}
    sums: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") not in DEVICE_CATEGORIES:
            continue
        launch = launches.get(int(e.get("args", {}).get("correlation", -1)))
        if launch is None:
            continue
        pid, tid, start, end, owner = launch  # a launch outside every op: the runtime call's own
        candidates = ops.get((pid, tid), [])
        i = bisect.bisect_right(starts.get((pid, tid), []), start)
        while i > 0:
            i -= 1
            if -candidates[i][1] >= end:
                owner = candidates[i][3]
                break
        sums[owner] += _ns(Decimal(e["dur"]))
    return {name: ns for name, ns in sums.items() if ns}


def _gpu_traces() -> list[Any]:
    params = []
    for path in sorted(KINETO_DIR.glob("*.json*")):
        if "cpu_only" in path.name:
            continue
        marks = [pytest.mark.slow] if path.stat().st_size > 500_000 else []
        params.append(pytest.param(path.name, marks=marks, id=path.name.split("__")[-1][:40]))
    return params or [pytest.param("", marks=pytest.mark.skip(reason="no shared traces"))]


@pytest.mark.parametrize("name", _gpu_traces())
def test_self_device_time_is_the_sum_of_the_kernels_launched(
    name: str, kineto_trace: FindTrace, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = kineto_trace(name)
    doc = _summary_json(capsys, str(trace))
    ours: dict[str, int] = defaultdict(int)
    for row in doc["rows"]:
        if row["kind"] != "device":
            ours[row["name"]] += row["self_device_ns"]
    expected = _kernel_time_by_launching_op(trace)
    assert expected, "a GPU trace launches kernels"
    assert {k: v for k, v in ours.items() if v} == expected
    device_rows = [r for r in doc["rows"] if r["kind"] == "device"]
    assert doc["self_device_total_ns"] == sum(r["self_device_ns"] for r in device_rows)
    assert sum(r["self_device_percent"] for r in device_rows) == pytest.approx(100.0)


# --- a spool of OTLP requests gives the trace's table ------------------------------------


def _spool(folder: Path, requests: list[bytes]) -> Path:
    spool = Spool(folder)
    for request in requests:
        assert spool.write(request)
    return folder


@pytest.mark.parametrize(
    "name", [ALEXNET, BERT_H100, DLRM_RANK0, AMD_MI250, pytest.param(MI300, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("shapes", [[], ["--group-by-input-shape"]], ids=["", "by-shape"])
def test_spool_at_full_detail_equals_the_trace(
    name: str, shapes: list[str], kineto_trace: FindTrace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = kineto_trace(name)
    result = convert(trace, detail="full", max_request_bytes=64 * 1024)  # several requests, traces split
    assert len(result.requests) > 1 or name == AMD_MI250
    folder = _spool(tmp_path / "spool", result.requests)
    from_trace = _summary_json(capsys, str(trace), *shapes)
    from_spool = _summary_json(capsys, str(folder), *shapes)
    assert from_spool["engine"] == "spans" and from_trace["engine"] in ("native", "reference")
    assert from_spool["rows"] == from_trace["rows"]
    assert from_spool["notes"] == []
    assert len(from_spool["sources"]) == len(result.requests)


def test_spool_is_read_as_the_job_reads_it(
    kineto_trace: FindTrace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO planted as a record is skipped (reading it blocked for ever); a folder others can
    write is refused with the job's own message."""
    import os

    result = convert(kineto_trace(ALEXNET), detail="full", max_request_bytes=64 * 1024)
    folder = _spool(tmp_path / "spool", result.requests)
    os.mkfifo(folder / "0000000000000000000-1-0.otlp")
    assert len(_summary_json(capsys, str(folder))["sources"]) == len(result.requests)
    folder.chmod(0o777)
    assert main(["summary", str(folder)]) == 1
    assert "chmod 700" in capsys.readouterr().err


def test_spool_at_default_detail_says_what_is_missing(
    kineto_trace: FindTrace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = kineto_trace(ALEXNET)
    result = convert(trace)  # default detail: short CPU events dropped or aggregated
    folder = _spool(tmp_path / "spool", result.requests)
    full = _rows(_summary_json(capsys, str(trace)))
    spool = _rows(_summary_json(capsys, str(folder)))
    missing = result.stats["dropped_short"] + result.stats["aggregated_events"]
    assert missing > 0
    note = _summary_json(capsys, str(folder))["notes"]
    assert len(note) == 1 and note[0].startswith(f"{missing} CPU events were aggregated or dropped")
    assert set(spool) <= set(full)
    for key, row in spool.items():  # kept spans carry their own exact self times
        assert row["calls"] <= full[key]["calls"]
        if key[1] == "device":  # device work is never dropped
            assert row == full[key]


def test_notes_go_to_stderr_unless_quiet(
    kineto_trace: FindTrace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _spool(tmp_path / "spool", convert(kineto_trace(AMD_MI250)).requests)
    assert main(["summary", str(folder)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1].startswith("Name ")
    assert captured.err.startswith("note: ") and "aggregated or dropped" in captured.err
    for argv in (["-q", "summary", str(folder)], ["summary", "--quiet", str(folder)]):
        assert main(argv) == 0
        quiet = capsys.readouterr()
        assert quiet.err == "" and quiet.out == captured.out


def test_several_paths_add_up(kineto_trace: FindTrace, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = kineto_trace(DLRM_RANK0), kineto_trace("dlrm_kineto__worker1")
    both = _rows(_summary_json(capsys, str(a), str(b)))
    one, two = _rows(_summary_json(capsys, str(a))), _rows(_summary_json(capsys, str(b)))
    assert set(both) == set(one) | set(two)
    for key, row in both.items():
        for field in ("calls", "self_cpu_ns", "cpu_total_ns", "self_device_ns", "device_total_ns"):
            assert row[field] == one.get(key, {}).get(field, 0) + two.get(key, {}).get(field, 0)


# --- the table ---------------------------------------------------------------------------


def _span_names(trace: Path) -> dict[str, str]:
    """Each kernel's event name -> the name its spans have in the converted trace."""
    names: dict[str, str] = {}
    for data in convert(trace, detail="full").requests:
        for rs in ExportTraceServiceRequest.FromString(data).resource_spans:
            for span in (span for ss in rs.scope_spans for span in ss.spans):
                attrs = {kv.key: kv.value.string_value for kv in span.attributes}
                if attrs.get("otelprof.event.category") in ("kernel", "Kernel"):
                    names[attrs.get("otelprof.gpu.kernel_name") or span.name] = span.name
    return names


def _table(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[list[str], int]:
    """The Name cells of a table's rows, and the Name column's width."""
    assert main(["summary", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    width = len(lines[0].split("  ")[0])
    end = lines.index(lines[0], 3)
    return [line[:width].rstrip() for line in lines[3:end]], width


def _reads_as(cell: str, span_name: str) -> bool:
    """``cell`` shows ``span_name``: whole, or cut with ``...``, a `` (k)`` number after either."""
    text = re.sub(r" \(\d+\)$", "", cell)
    return text == span_name or (text.endswith("...") and span_name.startswith(text[:-3]))


def test_table_sort_and_limit(kineto_trace: FindTrace, capsys: pytest.CaptureFixture[str]) -> None:
    trace = kineto_trace(ALEXNET)
    rows = _summary_json(capsys, str(trace))["rows"]
    by_calls = sorted(rows, key=lambda r: (-r["calls"], r["name"], r["kind"]))[:4]
    assert main(["summary", str(trace), "--sort", "count", "-n", "4"]) == 0  # torch's name for calls
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:4] == ["Name", "Self", "CPU", "%"]
    assert "Self Device" in lines[1] and lines[1].endswith("# of Calls")
    body = lines[3:7]
    assert [int(line.split()[-1]) for line in body] == [r["calls"] for r in by_calls]
    spans = _span_names(trace)  # a kernel's row reads as its spans do
    for line, row in zip(body, by_calls, strict=True):  # names longer than the column (55) end in ...
        assert line.startswith(spans.get(row["name"], row["name"])[:52])
    assert lines[8].startswith("Self CPU time total: ") and lines[9].startswith("Self Device time total: ")
    assert lines[10] == f"4 of {len(rows)} rows shown"


@pytest.mark.parametrize(
    "name", ["trace_filter__sampled_rank-0", AMD_MI250, DLRM_RANK0, pytest.param(MI300, marks=pytest.mark.slow)]
)
def test_kernel_rows_read_as_their_spans_and_apart(
    name: str, kineto_trace: FindTrace, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kernel's row shows the name its spans have (what tells kernels apart first, not the
    signature's first 52 characters); no two device rows read alike, and the Name column widens
    past 55 only as far as that needs."""
    trace = kineto_trace(name)
    rows = _summary_json(capsys, str(trace))["rows"]
    cells, width = _table(capsys, str(trace), "-n", "0")
    assert len(cells) == len(rows)
    spans = _span_names(trace)
    device = [(cell, row) for cell, row in zip(cells, rows, strict=True) if row["kind"] == "device"]
    kernels = [(cell, spans[row["name"]]) for cell, row in device if row["name"] in spans]
    assert len(kernels) > 10
    assert all(_reads_as(cell, span_name) for cell, span_name in kernels)
    assert all(cell == row["name"] for cell, row in device if row["name"] not in spans)  # memcpy, memset
    assert len({cell for cell, _ in device}) == len(device)
    if width > 55:  # one character less and two device rows would read alike (torch's cut: ...)
        shown = [(spans.get(row["name"], row["name"]), re.findall(r" \(\d+\)$", cell)) for cell, row in device]
        narrower = {
            text + "".join(n) if len(text) + len("".join(n)) < width - 4 else text[: width - 4 - len("".join(n))]
            for text, n in shown
        }
        assert len(narrower) < len(device)


def test_kernels_with_one_span_name_are_numbered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two kernels whose names fold alike are numbered in the order of their names; two that
    differ only past the column's 55th character widen it."""
    long = "k<" + "a" * 60
    names = [
        "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernelIBEE",
        "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernelIAEE",
        f"void {long}, 1>(int)",
        f"void {long}, 2>(int)",
        "Memcpy HtoD (Pinned -> Device)",
    ]
    events = [
        {"ph": "X", "cat": "gpu_memcpy" if n.startswith("Memcpy") else "kernel", "name": n, "pid": 0, "tid": 7,
         "ts": 10 * k, "dur": 5 - k, "args": {"device": 0, "stream": 7, "correlation": k + 1}}
        for k, n in enumerate(names)
    ]  # fmt: skip
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    cells, width = _table(capsys, str(trace))
    assert cells[:2] == ["Kernel<…> · cutlass_cudnn_train (2)", "Kernel<…> · cutlass_cudnn_train (1)"]
    assert cells[2:4] == [f"{long}, 1...", f"{long}, 2..."] and width == len(long) + 6
    assert cells[4] == "Memcpy HtoD (Pinned -> Device)"


def test_default_sort_is_self_device_time_then_cpu(kineto_trace: FindTrace, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = _summary_json(capsys, str(kineto_trace(ALEXNET)))["rows"]
    assert [r["self_device_ns"] for r in gpu] == sorted((r["self_device_ns"] for r in gpu), reverse=True)
    cpu = _summary_json(capsys, str(kineto_trace(CPU_ONLY)))["rows"]
    assert [r["self_cpu_ns"] for r in cpu] == sorted((r["self_cpu_ns"] for r in cpu), reverse=True)
    assert main(["summary", str(kineto_trace(CPU_ONLY))]) == 0
    assert "Device" not in capsys.readouterr().out, "no device columns without device time"


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda d: (d / "t.json", b"not json at all"),
        lambda d: (d / "t.json.gz", b"\x1f\x8b\x08\x00garbage"),
        lambda d: (d / "missing.json", None),
        lambda d: (d / "empty-spool", "dir"),
        lambda d: (d / "bad-spool", b"\xff\xff\xff"),
    ],
    ids=["not-json", "bad-gzip", "missing", "empty-spool", "corrupt-spool-record"],
)
def test_bad_input_exits_1_with_one_line(
    make: Callable[[Path], tuple[Path, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, content = make(tmp_path)
    if content == "dir":
        path.mkdir()
    elif path.name == "bad-spool":
        path.mkdir()
        (path / "0001.otlp").write_bytes(content)
    elif content is not None:
        path.write_bytes(content)
    assert main(["summary", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"otelprof: error: {path}")


@pytest.mark.parametrize(
    "argv", [[], ["x.json", "--sort", "fastest"], ["x.json", "-n", "-1"], ["x", "--format", "csv"]]
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", *argv]) == 2
    assert "error:" in capsys.readouterr().err


def test_python_m_otelprof_summary_without_torch(kineto_trace: FindTrace) -> None:
    code = (
        "import sys; sys.modules['torch'] = None; from otelprof.cli import main; "
        f"rc = main(['summary', {str(kineto_trace(AMD_MI250))!r}, '-n', '3']); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 of " in proc.stdout
