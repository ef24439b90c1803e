"""CUPTI activity records as Kineto events: what the Nsight Systems (``nsys.py``) and nvprof
(``nvprof.py``) readers share. Both profilers store CUPTI's activity kinds in SQLite tables of the
same names, with these columns in the same order: memcpy, memset and synchronization rows, kernel
launch configurations and device work become the same Kineto events whichever file they came from.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Iterator

from ._kineto import event, members, quote

MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
COPY_KIND = {
    1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
    10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD",
}  # fmt: skip
MEM_KIND = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static", 6: "Managed Static",
}  # fmt: skip
SYNC_KIND = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}


def as_int(value: object) -> int | None:
    return value if type(value) is int else None  # not a bool


class Db:
    """An open profile database: its tables, and rows read by column name."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self.db.execute(f'PRAGMA table_info("{table}")')}

    def rows(self, table: str, wanted: tuple[str, ...], where: str = "") -> Iterator[tuple[object, ...]]:
        """(rowid, *wanted) tuples in rowid order; a column the table lacks reads as None."""
        if table not in self.tables:
            return iter(())
        have = self.columns(table)
        cols = ", ".join(f'"{c}"' if c in have else "NULL" for c in wanted)
        return iter(self.db.execute(f'SELECT rowid, {cols} FROM "{table}" {where} ORDER BY rowid'))

    def scalar(self, sql: str) -> object:
        row = self.db.execute(sql).fetchone()
        return row[0] if row else None


def activity_fields(
    table: str, r: tuple[object, ...], mem_kind: Callable[[object], str | None] | None = None
) -> tuple[str, str, str]:
    """(category, quoted name, own args) of a memcpy, memset or sync row from its own columns
    (bytes, copyKind, srcKind, dstKind / bytes, memKind / syncType): nvprof's tables have the
    same names and these columns in the same order, its memory kinds read by ``mem_kind``."""
    kind_of = mem_kind or nsys_mem_kind
    if table == SYNC:
        return _sync_fields(as_int(r[0]) or 0)
    nbytes = members((("bytes", as_int(r[0])),))
    if table == MEMCPY:
        return "gpu_memcpy", _quoted(memcpy_name(r[1], kind_of(r[2]), kind_of(r[3]))), nbytes
    mem = kind_of(r[1])
    return "gpu_memset", _quoted(f"Memset ({mem})" if mem else "Memset"), nbytes


@functools.cache
def _sync_fields(sync_type: int) -> tuple[str, str, str]:
    kind = SYNC_KIND.get(sync_type, "Unknown Sync")
    return "cuda_sync", quote(kind), members((("cuda_sync_kind", kind),))


@functools.lru_cache(maxsize=1024)
def _quoted(name: str) -> str:
    """A generated name (memcpy, memset kinds: a few) as JSON."""
    return quote(name)


def memcpy_name(copy_kind: object, src: str | None, dst: str | None) -> str:
    kind = COPY_KIND.get(as_int(copy_kind) or 0, "Unknown")
    return f"Memcpy {kind} ({src} -> {dst})" if src and dst else f"Memcpy {kind}"


@functools.cache
def kernel_args(
    gx: object, gy: object, gz: object, bx: object, by: object, bz: object, regs: object, s: object, d: object
) -> str:
    """A kernel's own Kineto args: grid, block, registers per thread, shared memory (static +
    dynamic); cached, as launch configurations repeat."""
    grid, block = [as_int(v) for v in (gx, gy, gz)], [as_int(v) for v in (bx, by, bz)]
    shared = [as_int(s), as_int(d)]
    return members(
        (
            ("registers per thread", as_int(regs)),
            ("shared memory", None if None in shared else sum(v for v in shared if v is not None)),
            ("grid", None if None in grid else grid),
            ("block", None if None in block else block),
        )
    )


def device_event(
    cat: str, name: str, device: object, context: object, stream: object, corr: object, t: tuple[int, int], own: str
) -> str:
    """Device work as Kineto writes it: pid = device, tid = stream, and the same in args with
    the context and correlation id; ``own`` the table's own args."""
    dev, st = as_int(device), as_int(stream)
    args = [own] if own else []
    for key, value in (("correlation", corr), ("stream", st), ("context", context), ("device", dev)):
        if type(value) is int:
            args.insert(0, f'"{key}":{value}')
    return event(cat, name, dev, st, *t, ",".join(args))


def nsys_mem_kind(value: object) -> str | None:
    kind = as_int(value)  # 0 is Pageable
    return MEM_KIND.get(kind) if kind is not None else None
