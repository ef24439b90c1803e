"""Fixtures with ``torch.autograd.profiler.emit_nvtx`` ranges, written at test time.

- :func:`make_nsys_fixture` copies the shared saxpy Nsight Systems export (nsys 2022.2, schema
  2.9, ``../shared/traces/nsys``) and adds NVTX push/pop ranges (``eventType`` 59, text in
  ``StringIds`` through ``textId``, the default domain 0) on the thread that launches the saxpy
  kernels: a forward ``linear`` around the first launch, its backward around the second, and
  torch 0.4-1.1 / 1.2-1.12 markup around the third. The texts are what torch's ``getNvtxStr``
  writes (see otelprof/importer/nvtx_markup.py).
- :func:`make_nvprof_fixture` writes the same ops as an nvprof profile, in the schema nvprof
  writes (``StringTable``, ``CUPTI_ACTIVITY_KIND_*`` tables; the columns
  ``torch.autograd.profiler.parse_nvprof_trace`` queries), with a cudaLaunchKernel (cbid 211) and
  a kernel under each op that launches.

Each returns the rows it wrote (:class:`Op`): the fixture's own truth for the tests.
Run as a script to write both into a folder: ``python tests/importer/make_nvtx_fixture.py DIR``.
"""

from __future__ import annotations

import shutil
import sqlite3
import struct
import sys
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

SAXPY = "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"


def _inputs(n: int, known: dict[int, str] | None = None) -> str:
    """``input_op_ids``: (producer op id, output nr) per input, (0,-1) where torch saw none."""
    return "[" + ", ".join((known or {}).get(i, "(0,-1)") for i in range(n)) + "]"


@dataclass(frozen=True)
class Op:
    """One NVTX range the fixture wrote: its text, times (file units), and what it should become."""

    key: str
    text: str
    start: int
    end: int
    name: str  # the op name otelprof should give it
    seq: int | None = None
    dims: str | None = None  # otelprof.op.input_dims, compact JSON
    op_id: int | None = None
    parent: str | None = None  # key of the enclosing range (None: the saxpy range / the root)
    link: str | None = None  # key of the forward op a backward op links to
    launches: bool = False  # encloses a kernel launch directly


def _ops(launch: list[tuple[int, int]]) -> list[Op]:
    """The ops, placed around three kernel launches (start, end) of one thread."""
    (s1, e1), (s2, e2), (s3, e3) = launch[:3]
    ev = "autograd::engine::evaluate_function: "
    return [
        # torch 2.x forward: linear -> t (creates TBackward0, seq 7) and addmm (AddmmBackward0, seq 8)
        Op("linear", f"aten::linear, seq = 7, op_id = 101, sizes = [[2, 4], [3, 4], [3]], input_op_ids = {_inputs(3)}",
           s1 - 5000, e1 + 5000, "aten::linear", 7, "[[2,4],[3,4],[3]]", 101),
        Op("t", f"aten::t, seq = 7, op_id = 102, sizes = [[3, 4]], input_op_ids = {_inputs(1)}",
           s1 - 4000, s1 - 3000, "aten::t", 7, "[[3,4]]", 102, parent="linear"),
        Op("addmm", "aten::addmm, seq = 8, op_id = 103, sizes = [[3], [2, 4], [4, 3], [], []], "
           f"input_op_ids = {_inputs(5, {2: '(102,0)'})}",
           s1 - 2000, e1 + 2000, "aten::addmm", 8, "[[3],[2,4],[4,3],[],[]]", 103, parent="linear", launches=True),
        # torch 2.x backward: the engine's range, the node (same seq as its forward op), its ops
        Op("eval_addmm", f"{ev}AddmmBackward0, op_id = 201", s2 - 5000, e2 + 1000, f"{ev}AddmmBackward0", op_id=201),
        Op("addmm_bwd", "AddmmBackward0, seq = 8, op_id = 202, sizes = [[2, 3]], input_op_ids = [(103,0)]",
           s2 - 4500, e2 + 500, "AddmmBackward0", 8, "[[2,3]]", 202, parent="eval_addmm", link="addmm"),
        Op("mm", f"aten::mm, seq = 9, op_id = 203, sizes = [[2, 3], [3, 4]], input_op_ids = {_inputs(2)}",
           s2 - 1000, e2 + 200, "aten::mm", 9, "[[2,3],[3,4]]", 203, parent="addmm_bwd", launches=True),
        Op("eval_t", f"{ev}TBackward0, op_id = 204", e2 + 2000, e2 + 5000, f"{ev}TBackward0", op_id=204),
        Op("t_bwd", "TBackward0, seq = 7, op_id = 205", e2 + 2500, e2 + 4500, "TBackward0", 7, None, 205,
           parent="eval_t", link="t"),
        # torch 0.4-1.1: "seq=" forward, "stashed seq=" backward apply()
        Op("relu", "relu, seq=3", s3 - 5000, s3 - 3000, "relu", 3),
        Op("relu_bwd", "ThresholdBackward, stashed seq=3", s3 - 2000, e3 + 2000, "ThresholdBackward", 3,
           link="relu", launches=True),
        # a user range with a comma, and torch 1.2-1.12's nameless op (shapes, no sequence number)
        Op("user", "step 1, warm-up", e3 + 2500, e3 + 5500, "step 1, warm-up"),
        Op("nameless", ", sizes = [[4, 4], []]", e3 + 3000, e3 + 4000, ", sizes = [[4, 4], []]",
           dims="[[4,4],[]]", parent="user"),
    ]  # fmt: skip


def make_nsys_fixture(shared_nsys: Path, dst: Path) -> list[Op]:
    """Copy the saxpy export to ``dst`` with the ops added; returns the ops."""
    src = next(p for p in sorted(shared_nsys.glob("*")) if p.name.endswith(SAXPY))
    shutil.copyfile(src, dst)
    with closing(sqlite3.connect(dst)) as db, db:
        launches = db.execute(
            "SELECT r.start, r.end, r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "WHERE s.value LIKE 'cudaLaunchKernel%' AND r.eventClass = 0 ORDER BY r.start"
        ).fetchall()
        tid = launches[0][2]
        ops = _ops([(s, e) for s, e, _ in launches])
        (next_id,) = db.execute("SELECT max(id) + 1 FROM StringIds").fetchone()
        for op in ops:
            db.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (next_id, op.text))
            db.execute(
                "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId, domainId) "
                "VALUES (?, ?, 59, ?, ?, 0)",
                (op.start, op.end, tid, next_id),
            )
            next_id += 1
    return ops


# nvprof's tables, as nvprof creates them (the columns torch's parse_nvprof_trace reads among them)
_NVPROF_SCHEMA = """
CREATE TABLE StringTable(_id_ INTEGER PRIMARY KEY AUTOINCREMENT, value TEXT NOT NULL UNIQUE);
CREATE TABLE Version(version INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME(_id_ INTEGER PRIMARY KEY AUTOINCREMENT, cbid INT NOT NULL,
  start INT NOT NULL, end INT NOT NULL, processId INT NOT NULL, threadId INT NOT NULL,
  correlationId INT NOT NULL, returnValue INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_DRIVER(_id_ INTEGER PRIMARY KEY AUTOINCREMENT, cbid INT NOT NULL,
  start INT NOT NULL, end INT NOT NULL, processId INT NOT NULL, threadId INT NOT NULL,
  correlationId INT NOT NULL, returnValue INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL(_id_ INTEGER PRIMARY KEY AUTOINCREMENT,
  cacheConfig BLOB NOT NULL, sharedMemoryConfig INT NOT NULL, registersPerThread INT NOT NULL,
  partitionedGlobalCacheRequested INT NOT NULL, partitionedGlobalCacheExecuted INT NOT NULL,
  start INT NOT NULL, end INT NOT NULL, completed INT NOT NULL, deviceId INT NOT NULL,
  contextId INT NOT NULL, streamId INT NOT NULL, gridX INT NOT NULL, gridY INT NOT NULL,
  gridZ INT NOT NULL, blockX INT NOT NULL, blockY INT NOT NULL, blockZ INT NOT NULL,
  staticSharedMemory INT NOT NULL, dynamicSharedMemory INT NOT NULL, localMemoryPerThread INT NOT NULL,
  localMemoryTotal INT NOT NULL, correlationId INT NOT NULL, gridId INT NOT NULL, name INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY(_id_ INTEGER PRIMARY KEY AUTOINCREMENT, copyKind INT NOT NULL,
  srcKind INT NOT NULL, dstKind INT NOT NULL, flags INT NOT NULL, bytes INT NOT NULL, start INT NOT NULL,
  end INT NOT NULL, deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL,
  correlationId INT NOT NULL, runtimeCorrelationId INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MARKER(_id_ INTEGER PRIMARY KEY AUTOINCREMENT, flags INT NOT NULL,
  timestamp INT NOT NULL, id INT NOT NULL, objectKind INT NOT NULL, objectId BLOB NOT NULL,
  name INT NOT NULL, domain INT NOT NULL);
"""
NVPROF_PID, NVPROF_TID = 4242, 4243
NVPROF_BASE = 1_700_000_000_000_000_000  # CUPTI nanoseconds
KERNEL = "_Z5saxpyifPfS_"  # nvprof keeps kernel names mangled: saxpy(int, float, float*, float*)


@dataclass(frozen=True)
class Call:
    """A runtime call the nvprof fixture wrote, with its kernel or copy."""

    cbid: int
    start: int
    end: int
    correlation: int
    device_start: int
    device_end: int
    kind: str  # "kernel" or "memcpy"


def make_nvprof_fixture(dst: Path) -> tuple[list[Op], list[Call]]:
    """An nvprof profile with the same ops, one thread, a launch + kernel under each op that
    launches, and a cudaMemcpy (HtoD, pageable -> device) outside any range."""
    step = 100_000
    launch = [(NVPROF_BASE + k * step + 40_000, NVPROF_BASE + k * step + 45_000) for k in range(1, 4)]
    ops = _ops(launch)
    # distinct kernel durations (8, 9, 10 µs), so a kernel charged to the wrong range shows
    calls = [Call(211, s, e, 10 + k, e + 1_000, e + 9_000 + 1_000 * k, "kernel") for k, (s, e) in enumerate(launch)]
    calls.append(
        Call(31, NVPROF_BASE + 1_000, NVPROF_BASE + 9_000, 99, NVPROF_BASE + 2_000, NVPROF_BASE + 8_000, "memcpy")
    )
    thread = struct.pack("<IIi", NVPROF_PID, NVPROF_TID, 0)  # CUpti_ActivityObjectKindId, 12 bytes
    with closing(sqlite3.connect(dst)) as db, db:
        db.executescript(_NVPROF_SCHEMA)
        db.execute("INSERT INTO Version VALUES (11)")

        def string(value: str) -> int:
            db.execute("INSERT OR IGNORE INTO StringTable (value) VALUES (?)", (value,))
            return int(db.execute("SELECT _id_ FROM StringTable WHERE value = ?", (value,)).fetchone()[0])

        for marker_id, op in enumerate(ops, start=1):
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MARKER (flags, timestamp, id, objectKind, objectId, name, domain) "
                "VALUES (2, ?, ?, 2, ?, ?, 0)",
                (op.start, marker_id, thread, string(op.text)),
            )
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MARKER (flags, timestamp, id, objectKind, objectId, name, domain) "
                "VALUES (4, ?, ?, 2, ?, 0, 0)",
                (op.end, marker_id, thread),
            )
        kernel = string(KERNEL)
        for c in calls:
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (cbid, start, end, processId, threadId, correlationId, "
                "returnValue) VALUES (?, ?, ?, ?, ?, ?, 0)",
                (c.cbid, c.start, c.end, NVPROF_PID, NVPROF_TID, c.correlation),
            )
            if c.kind == "kernel":
                db.execute(
                    "INSERT INTO CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL VALUES (NULL, x'00', 0, 16, 0, 0, ?, ?, ?, "
                    "0, 1, 7, 2, 1, 1, 256, 1, 1, 0, 128, 0, 0, ?, ?, ?)",
                    (c.device_start, c.device_end, c.device_end, c.correlation, c.correlation, kernel),
                )
            else:
                db.execute(
                    "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (NULL, 1, 1, 3, 0, 4096, ?, ?, 0, 1, 7, ?, ?)",
                    (c.device_start, c.device_end, c.correlation, c.correlation),
                )
    return ops, calls


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    shared = Path(__file__).resolve().parents[3] / "shared" / "traces" / "nsys"
    make_nsys_fixture(shared, out / "saxpy-emit-nvtx.sqlite")
    make_nvprof_fixture(out / "emit-nvtx.nvvp")
    print(f"wrote {out / 'saxpy-emit-nvtx.sqlite'} and {out / 'emit-nvtx.nvvp'}")
