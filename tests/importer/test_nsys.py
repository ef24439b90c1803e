"""Nsight Systems SQLite exports, both schema generations, at full detail (every row a span),
checked against the database itself (read here with plain SQL, independently of otelprof's
reader). Default detail (budget, roll-ups, accounting) is tests/importer/test_import_volume.py."""

from __future__ import annotations

import sqlite3
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from otelprof.converter import ConvertOptions
from otelprof.importer.nsys import convert_nsys
from otelprof.otlp.names import fold_kernel_name

from .helpers import NSYS, Got, decode, shared

CLOVERLEAF = "cloverleaf"  # schema 3.13 (nsys 2024.5): no NVTX, syncs
SAXPY = "saxpy"  # schema 2.9 (nsys 2022.2): NVTX ranges, runtime rows doubled by backtrace records


def _db(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


@cache  # each export is converted once for the module's tests
def _convert(fragment: str) -> tuple[Path, list[Got]]:
    path = shared(fragment, NSYS)
    return path, decode(convert_nsys(path, ConvertOptions(run_id="test", detail="full")).requests)


def _count(db: sqlite3.Connection, sql: str) -> int:
    tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    table = sql.split(" FROM ")[1].split()[0]
    return int(db.execute(sql).fetchone()[0]) if table in tables else 0


@pytest.mark.parametrize("fragment", [CLOVERLEAF, SAXPY])
def test_counts_per_category_match_the_tables(fragment: str) -> None:
    path, spans = _convert(fragment)
    db = _db(path)
    want = Counter(
        {
            "kernel": _count(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"),
            "gpu_memcpy": _count(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY"),
            "gpu_memset": _count(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET"),
            "cuda_sync": _count(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"),
            # eventClass 67 rows repeat a call with its backtrace
            "cuda_runtime": _count(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 0"),
            "cuda_driver": _count(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 1"),
            "user_annotation": _count(
                db, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL"
            ),
            "Trace": 1,  # the process, the trace's root
        }
    )
    assert Counter(g.category for g in spans) == +want
    assert len({g.span.span_id for g in spans}) == len(spans)
    assert len({g.span.trace_id for g in spans}) == 1
    [root] = [g for g in spans if not g.span.parent_span_id]
    (pid, exe) = db.execute(
        "SELECT pid, name FROM PROCESSES WHERE pid = "
        "(SELECT globalTid >> 24 & 16777215 FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1)"
    ).fetchone()
    assert (root.category, root.span.name, root.resource["process.pid"]) == ("Trace", Path(exe).name, pid)
    assert root.resource["process.executable.path"] == exe
    assert str(root.resource["otelprof.source.format"]).startswith("nsys-sqlite ")


@pytest.mark.parametrize("fragment", [CLOVERLEAF, SAXPY])
def test_device_work_hangs_under_the_runtime_call_with_its_correlation_id(fragment: str) -> None:
    path, spans = _convert(fragment)
    db = _db(path)
    launches = dict(
        db.execute(
            "SELECT r.correlationId, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "WHERE r.eventClass != 67"
        )
    )
    by_id = {g.span.span_id: g for g in spans}
    device = [g for g in spans if g.category in ("kernel", "gpu_memcpy", "cuda_sync")]
    assert device
    for g in device:
        corr = g.attr("otelprof.gpu.correlation_id")
        parent = by_id[g.span.parent_span_id]
        assert parent.category in ("cuda_runtime", "cuda_driver")
        assert parent.attr("otelprof.gpu.correlation_id") == corr
        assert str(launches[corr]).startswith(parent.span.name)  # cudaLaunchKernel_v7000 -> cudaLaunchKernel


def test_times_are_epoch_nanoseconds_of_the_session() -> None:
    path, spans = _convert(CLOVERLEAF)
    db = _db(path)
    (base,) = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    start, end, corr, name = db.execute(
        "SELECT k.start, k.end, k.correlationId, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName ORDER BY k.start LIMIT 1"
    ).fetchone()
    kernel = next(g for g in spans if g.category == "kernel" and g.attr("otelprof.gpu.correlation_id") == corr)
    assert (kernel.span.name, kernel.span.start_time_unix_nano, kernel.span.end_time_unix_nano) == (
        fold_kernel_name(name),
        base + start,
        base + end,
    )
    assert kernel.attr("otelprof.gpu.kernel_name") == (name if fold_kernel_name(name) != name else None)
    assert kernel.attr("otelprof.gpu.device") == 0
    assert kernel.resource["otelprof.gpu.model"] == "NVIDIA A100-SXM4-80GB"
    assert kernel.resource["host.name"] == "nid008553"


def test_nvtx_ranges_are_parents_of_the_work_inside_them() -> None:
    path, spans = _convert(SAXPY)
    db = _db(path)
    ranges = [
        (start, end, text or value)
        for start, end, text, value in db.execute(
            "SELECT n.start, n.end, n.text, s.value FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
            "WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL"
        )
    ]
    (base,) = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    by_id = {g.span.span_id: g for g in spans}
    runtime = [g for g in spans if g.category in ("cuda_runtime", "cuda_driver")]
    inside = 0
    for g in runtime:  # one thread in this export: the innermost range containing the call
        s, e = g.span.start_time_unix_nano - base, g.span.end_time_unix_nano - base
        holders = [r for r in ranges if r[0] <= s and e <= r[1]]
        parent = by_id[g.span.parent_span_id]
        if holders:
            innermost = min(holders, key=lambda r: r[1] - r[0])
            assert (parent.category, parent.span.name) == ("user_annotation", innermost[2])
            inside += 1
        else:
            assert (parent.category, parent.span.parent_span_id) == ("Trace", b"")
    assert inside == 24
    # each saxpy kernel: kernel -> cudaLaunchKernel -> NVTX "saxpy"
    kernels = [g for g in spans if g.category == "kernel"]
    assert len(kernels) == 5
    for k in kernels:
        launch = by_id[k.span.parent_span_id]
        assert (launch.span.name, by_id[launch.span.parent_span_id].span.name) == ("cudaLaunchKernel", "saxpy")
    annotations = {g.span.name for g in spans if g.category == "user_annotation"}
    assert {"MPI_Init", "MPI_Send", "MPI_Recv", "MPI_Finalize"} <= annotations  # the MPI domain's ranges


def test_the_same_file_converts_to_the_same_bytes() -> None:
    path = shared(SAXPY, NSYS)
    first = convert_nsys(path, ConvertOptions(run_id="r")).requests
    assert convert_nsys(path, ConvertOptions(run_id="r")).requests == first
    assert convert_nsys(path, ConvertOptions(run_id="other")).requests != first


@pytest.mark.parametrize("fragment", [CLOVERLEAF, SAXPY])
def test_memcpys_name_pageable_memory_too(fragment: str) -> None:
    """ENUM_CUDA_MEM_KIND 0 is Pageable (it used to be read as missing)."""
    path, spans = _convert(fragment)
    kinds = {0: "Pageable", 2: "Device"}
    want = Counter(
        f"Memcpy {'HtoD' if copy == 1 else 'DtoH'} ({kinds[src]} -> {kinds[dst]})"
        for copy, src, dst in _db(path).execute("SELECT copyKind, srcKind, dstKind FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    )
    assert Counter(g.span.name for g in spans if g.category == "gpu_memcpy") == want
    assert set(want) == {"Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pageable)"}
