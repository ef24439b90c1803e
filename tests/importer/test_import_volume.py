"""Imports at default detail follow the Kineto converter's volume rules (both shared Nsight
Systems exports, the emit_nvtx nsys copy and the nvprof fixture): no trace over the span
budget, device work under its runtime call when that is a span, repeated calls combined, every
row accounted for (by category, count and time, against plain SQL over the file), GPU lanes for
device work without its launch, the same ids on a second import, and both engines agreeing."""

from __future__ import annotations

import sqlite3
from collections import Counter, defaultdict
from contextlib import closing
from functools import cache
from pathlib import Path

import pytest

from otelprof.converter import ConvertOptions, ConvertResult
from otelprof.converter._api import native_available
from otelprof.converter._options import Detail
from otelprof.importer.nsys import convert_nsys

from .helpers import NSYS, Got, decode, shared
from .make_nvtx_fixture import SAXPY, make_nsys_fixture, make_nvprof_fixture

ENGINES = ["native", "reference"] if native_available() else ["reference"]
FILES = ["cloverleaf", "saxpy", "nsys-emit-nvtx", "nvprof-emit-nvtx"]
#: Kineto category -> the class a parent's ``otelprof.folded.<class>`` counts it in.
CLASS = {
    "user_annotation": "op", "cpu_op": "op", "cuda_runtime": "runtime", "cuda_driver": "runtime",
    "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_sync": "device_other",
}  # fmt: skip
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("volume")
    make_nvprof_fixture(folder / "emit-nvtx.nvvp")
    make_nsys_fixture(NSYS, folder / SAXPY)  # skips without ../shared, as shared() does
    return {
        "cloverleaf": shared("cloverleaf", NSYS),
        "saxpy": shared("saxpy", NSYS),
        "nsys-emit-nvtx": folder / SAXPY,
        "nvprof-emit-nvtx": folder / "emit-nvtx.nvvp",
    }


@cache
def _convert(path: Path, engine: str, **options: object) -> ConvertResult:
    return convert_nsys(path, ConvertOptions(run_id="volume", **options), engine=engine)  # type: ignore[arg-type]


def _query(path: Path, sql: str) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return db.execute(sql).fetchall() if sql.split(" FROM ")[1].split()[0] in tables else []


def _rows(path: Path) -> dict[str, tuple[int, int]]:
    """The file's own rows by class: (count, summed duration in ns), by plain SQL."""
    nvprof = path.suffix == ".nvvp"
    span = "count(*), coalesce(sum(max(end, start) - start), 0)"
    runtime = ["CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"] if nvprof else []
    queries = {
        "runtime": [f"SELECT {span} FROM {t}" for t in runtime]
        or [f"SELECT {span} FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1)"],
        "kernel": [
            f"SELECT {span} FROM CUPTI_ACTIVITY_KIND_{'CONCURRENT_KERNEL' if nvprof else 'KERNEL'}",
        ],
        "memcpy": [f"SELECT {span} FROM CUPTI_ACTIVITY_KIND_MEMCPY"],
        "memset": [f"SELECT {span} FROM CUPTI_ACTIVITY_KIND_MEMSET"],
        "device_other": [f"SELECT {span} FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"],
        "op": [
            "SELECT count(*), coalesce(sum(e.timestamp - s.timestamp), 0) FROM CUPTI_ACTIVITY_KIND_MARKER s "
            "JOIN CUPTI_ACTIVITY_KIND_MARKER e ON e.id = s.id AND e.flags = 4 WHERE s.flags = 2"
            if nvprof
            else f"SELECT {span} FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL"
        ],
    }
    out: dict[str, tuple[int, int]] = {}
    for cls, sqls in queries.items():
        got = [row for sql in sqls for row in _query(path, sql)]
        out[cls] = (sum(int(str(r[0])) for r in got), sum(int(str(r[1])) for r in got))
    return out


def _is_aggregate(g: Got) -> bool:
    return g.attr("otelprof.aggregated_count") is not None


def _is_plain(g: Got) -> bool:
    """A span that is one row: no aggregate, no synthetic span, not the process root."""
    return not _is_aggregate(g) and not g.attr("otelprof.synthetic") and g.category in CLASS


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", FILES)
def test_no_trace_is_over_the_budget(files: dict[str, Path], name: str, engine: str) -> None:
    for budget in (1000, 100):
        spans = decode(_convert(files[name], engine, span_budget=budget).requests)
        per_trace = Counter(g.span.trace_id for g in spans)
        assert max(per_trace.values()) <= budget, (budget, sorted(per_trace.values()))
        assert all(sum(1 for g in spans if g.span.trace_id == t and not g.span.parent_span_id) == 1 for t in per_trace)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", FILES)
def test_every_row_is_a_span_an_aggregate_member_or_folded_into_a_parent(
    files: dict[str, Path], name: str, engine: str
) -> None:
    """Per class, count and time: plain spans + aggregates' members + what parents say they
    fold (``otelprof.folded.<class>.*``) = the file's rows, to the nanosecond."""
    result = _convert(files[name], engine)
    spans = decode(result.requests)
    got: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for g in spans:
        if g.category in CLASS and not g.attr("otelprof.synthetic"):
            cls = CLASS[str(g.category)]
            if _is_aggregate(g):
                got[cls][0] += int(str(g.attr("otelprof.aggregated_count")))
                got[cls][1] += int(str(g.attr("otelprof.aggregated_duration_ns")))
            else:
                got[cls][0] += 1
                got[cls][1] += g.span.end_time_unix_nano - g.span.start_time_unix_nano
        for cls in set(CLASS.values()):
            got[cls][0] += int(str(g.attr(f"otelprof.folded.{cls}.count") or 0))
            got[cls][1] += int(str(g.attr(f"otelprof.folded.{cls}.duration_ns") or 0))
    want = _rows(files[name])
    assert {cls: tuple(v) for cls, v in got.items() if v != [0, 0]} == {c: v for c, v in want.items() if v != (0, 0)}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", FILES)
def test_the_counters_reconcile_with_the_rows_and_the_spans(files: dict[str, Path], name: str, engine: str) -> None:
    result = _convert(files[name], engine)
    s, spans = result.stats, decode(result.requests)
    dropped = sum(v for k, v in s.items() if k.startswith("dropped_"))
    # each process adds one event: the Trace event its window trace is rooted at
    assert s["events_total"] == s["ignored_events"] + s["complete_events"] - s["processes"]
    assert s["complete_events"] == (
        s["spans"] - s["synthetic_spans"] - s["aggregate_spans"] + s["aggregated_events"] + dropped
    )
    assert s["spans"] == len(spans) and s["requests"] == len(result.requests)
    aggregates = [g for g in spans if _is_aggregate(g)]
    assert len(aggregates) == s["aggregate_spans"]
    assert sum(int(str(g.attr("otelprof.aggregated_count"))) for g in aggregates) == s["aggregated_events"]
    rows = _rows(files[name])
    assert s["kernels"] + s["memcpys"] + s["memsets"] + s["syncs"] == sum(
        rows[c][0] for c in ("kernel", "memcpy", "memset", "device_other")
    )
    assert (s["runtime_calls"], s["nvtx_ranges"]) == (rows["runtime"][0], rows["op"][0])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", FILES)
def test_device_work_hangs_under_its_runtime_call_when_that_is_a_span(
    files: dict[str, Path], name: str, engine: str
) -> None:
    spans = decode(_convert(files[name], engine).requests)
    by_id = {(g.span.trace_id, g.span.span_id): g for g in spans}
    calls = {
        (g.span.trace_id, g.attr("otelprof.gpu.correlation_id")): g
        for g in spans
        if _is_plain(g) and CLASS[str(g.category)] == "runtime"
    }
    under = 0
    for g in spans:
        if _is_plain(g) and g.category in DEVICE:
            call = calls.get((g.span.trace_id, g.attr("otelprof.gpu.correlation_id")))
            if call is not None:
                assert g.span.parent_span_id == call.span.span_id, g.span.name
                under += 1
            else:  # its call is folded: under what holds it (the op that made the call, a root)
                assert by_id[(g.span.trace_id, g.span.parent_span_id)].category not in DEVICE
    # the nvprof fixture's calls take 5 µs: at default detail they fold into the ops around them
    assert under > 0 or name == "nvprof-emit-nvtx"


@pytest.mark.parametrize("engine", ENGINES)
def test_the_1312_repeated_calls_are_combined(files: dict[str, Path], engine: str) -> None:
    """Before: one trace of 5,952 spans, 1,312 each of these, none combined."""
    path = files["cloverleaf"]
    spans = decode(_convert(path, engine).requests)
    names = Counter(g.span.name for g in spans if _is_plain(g))
    for call in ("cudaLaunchKernel", "cudaDeviceSynchronize", "Event Sync"):
        assert names[call] < 1312, call
    assert any(_is_aggregate(g) for g in spans)
    assert len(spans) < sum(n for n, _ in _rows(path).values()) / 2


@pytest.mark.parametrize("name", FILES)
def test_a_second_import_gives_the_same_requests_and_both_engines_agree(files: dict[str, Path], name: str) -> None:
    details: tuple[Detail, ...] = ("default", "full")
    for detail in details:
        first = convert_nsys(files[name], ConvertOptions(run_id="ids", detail=detail), engine="reference").requests
        again = convert_nsys(files[name], ConvertOptions(run_id="ids", detail=detail), engine="reference").requests
        assert again == first, detail
        for engine in ENGINES:
            assert (
                _convert(files[name], engine, detail=detail).requests
                == _convert(files[name], "reference", detail=detail).requests
            ), (engine, detail)


def _without_launch(src: Path, dst: Path) -> int:
    """A copy of ``src`` with the runtime rows of one memcpy's call removed; its correlation id."""
    dst.write_bytes(src.read_bytes())
    with closing(sqlite3.connect(dst)) as db, db:
        (corr,) = db.execute("SELECT min(correlationId) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()
        assert db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = ?", (corr,)).rowcount > 0
    return int(corr)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["saxpy", "nvprof-emit-nvtx"])
@pytest.mark.parametrize("detail", ["default", "full"])
def test_device_work_without_its_launch_goes_under_a_gpu_lane(
    files: dict[str, Path], tmp_path: Path, name: str, engine: str, detail: Detail
) -> None:
    src = files[name]
    path = tmp_path / src.name
    corr = _without_launch(src, path)
    spans = decode(convert_nsys(path, ConvertOptions(run_id="lane", detail=detail), engine=engine).requests)
    by_id = {(g.span.trace_id, g.span.span_id): g for g in spans}
    [memcpy] = [g for g in spans if g.category == "gpu_memcpy" and g.attr("otelprof.gpu.correlation_id") == corr]
    lane = by_id[(memcpy.span.trace_id, memcpy.span.parent_span_id)]
    device, stream = memcpy.attr("otelprof.gpu.device"), memcpy.attr("otelprof.gpu.stream")
    assert (lane.category, lane.attr("otelprof.synthetic")) == ("otelprof", True)
    assert (lane.attr("otelprof.gpu.device"), lane.attr("otelprof.gpu.stream")) == (device, stream)
    assert lane.span.name == f"gpu {device} \N{MIDDLE DOT} stream {stream}"
    assert lane.span.start_time_unix_nano <= memcpy.span.start_time_unix_nano
    assert memcpy.span.end_time_unix_nano <= lane.span.end_time_unix_nano
    root = by_id[(lane.span.trace_id, lane.span.parent_span_id)]
    assert not root.span.parent_span_id  # the lane hangs off the trace's root, the work off the lane


@pytest.mark.parametrize("name", ["saxpy", "nvprof-emit-nvtx"])
def test_marks_and_unterminated_ranges_are_counted_and_ignored(
    files: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """An NVTX mark and a range that never ends: read, counted as ignored, and the counters
    still reconcile with the rows."""
    src = files[name]
    path = tmp_path / src.name
    path.write_bytes(src.read_bytes())
    with closing(sqlite3.connect(path)) as db, db:
        if name == "saxpy":
            (tid, ts) = db.execute("SELECT globalTid, max(end) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()
            insert = "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) VALUES (?, ?, ?, ?, ?)"
            db.execute(insert, (ts + 10, None, 34, tid, "a mark"))
            db.execute(insert, (ts + 20, None, 59, tid, "never ends"))
        else:
            (obj, ts, mid, text) = db.execute(
                "SELECT objectId, max(timestamp), max(id) + 1, max(name) FROM CUPTI_ACTIVITY_KIND_MARKER"
            ).fetchone()
            insert = (
                "INSERT INTO CUPTI_ACTIVITY_KIND_MARKER (flags, timestamp, id, objectKind, objectId, name, domain) "
            )
            db.execute(insert + "VALUES (1, ?, ?, 2, ?, ?, 0)", (ts + 10, mid, obj, text))  # instantaneous
            db.execute(insert + "VALUES (2, ?, ?, 2, ?, ?, 0)", (ts + 20, mid + 1, obj, text))  # no end row
    before = _convert(src, "reference").stats
    s = convert_nsys(path, ConvertOptions(run_id="volume"), engine="reference").stats
    assert (s["nvtx_marks"], s["ignored_events"]) == (before["nvtx_marks"] + 1, before["ignored_events"] + 2)
    assert (s["events_total"], s["spans"]) == (before["events_total"] + 2, before["spans"])
    assert s["events_total"] == s["ignored_events"] + s["complete_events"] - s["processes"]
