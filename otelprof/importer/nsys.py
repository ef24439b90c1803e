"""Nsight Systems SQLite exports (``nsys export --type sqlite``) -> OTLP spans.

Both export schema generations are read: 2.x (nsys 2021-2022: ``EXPORT_META_DATA``, runtime
rows duplicated as "CUDA backtrace" records) and 3.x (nsys 2023 on: ``META_DATA_EXPORT``).
Columns are looked up by name, so columns a generation adds or drops do not matter.

Each profiled process's rows are written as a Kineto trace (``_kineto.py``: NVTX ranges as
user annotations or, with ``emit_nvtx`` markup, ops; CUDA runtime/driver calls; kernels,
memcpys, memsets and syncs with their correlation id, device and stream) and converted by the
Kineto converter, so imports follow its span model (docs/semantic-conventions.md, "Nsight
Systems exports"). The same file and options always give the same ids.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote as url_quote

from ..converter import ConvertOptions, ConvertResult, TraceFormatError
from ..otlp._text import clean
from ..otlp.resource import ResourceFacts
from . import nvprof
from ._cupti import MEMCPY, MEMSET, SYNC, Db, activity_fields, as_int, device_event, kernel_args
from ._kineto import (
    IMPORT_STAT_KEYS,
    ProcessDoc,
    Range,
    add_ranges,
    convert_processes,
    event,
    file_meta,
    members,
    quote,
    valid_times,
)

SUPPORTED_MAJORS = (2, 3)
_META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # 3.x, 2.x
_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
_NVTX = "NVTX_EVENTS"

# ENUM_NSYS_EVENT_CLASS / ENUM_NSYS_EVENT_TYPE values (the same in both generations; 2.x
# exports do not carry the enum tables, so they are spelled out here).
_CLASS_DRIVER = 1  # 0: runtime
_CLASS_BACKTRACE = 67  # 2.x: a second row per call holding its call chain
_NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
_NVTX_MARK = 34
# ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_MEM_KIND, ENUM_CUPTI_SYNC_TYPE, named as Kineto names them
_VERSION_SUFFIX = re.compile(r"_v[0-9]+\Z")  # cudaMalloc_v3020 -> cudaMalloc, as nsys shows it
_DEVICE_COLS = ("start", "end", "deviceId", "contextId", "streamId", "correlationId")
_KERNEL_COLS = (
    "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread", "staticSharedMemory",
    "dynamicSharedMemory",
)  # fmt: skip


def pid_of(global_id: int) -> int:
    """nsys GlobalId: hardware (8 bits) | VM (8) | pid (24) | tid (24)."""
    return (global_id >> 24) & 0xFFFFFF


def tid_of(global_id: int) -> int:
    return global_id & 0xFFFFFF


def convert_nsys(path: str | Path, options: ConvertOptions, engine: str = "auto") -> ConvertResult:
    """Read an Nsight Systems SQLite export (or an nvprof profile); raises TraceFormatError with
    a one-line reason."""
    path = Path(path)
    try:
        with closing(_connect(path)) as db:
            return _convert(db, path, options, engine)
    except sqlite3.Error as exc:  # not a database, truncated, malformed
        raise TraceFormatError(f"{path}: not a readable SQLite database ({exc})") from None


def _connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise TraceFormatError(f"{path}: cannot read (not a file)")
    if path.stat().st_size == 0:
        raise TraceFormatError(f"{path}: empty file (not an Nsight Systems SQLite export)")
    # read-only and immutable: works on read-only media and never writes a journal
    return sqlite3.connect(f"file:{url_quote(str(path.resolve()))}?mode=ro&immutable=1", uri=True)


def _schema_version(db: Db, path: Path) -> str:
    if not db.tables:
        raise TraceFormatError(f"{path}: empty SQLite database (no tables; not an Nsight Systems export)")
    meta = next((t for t in _META_TABLES if t in db.tables), None)
    if meta is None or "StringIds" not in db.tables:
        raise TraceFormatError(
            f"{path}: not an Nsight Systems SQLite export (no export metadata or StringIds table)"
            " nor an nvprof profile (no StringTable and CUPTI_ACTIVITY_KIND_* tables)"
        )
    version = db.scalar(f"SELECT value FROM {meta} WHERE name = 'EXPORT_SCHEMA_VERSION'")
    major = str(version or "").split(".", 1)[0]
    if not major.isdigit() or int(major) not in SUPPORTED_MAJORS:
        supported = ", ".join(f"{m}.x" for m in SUPPORTED_MAJORS)
        raise TraceFormatError(f"{path}: unsupported Nsight Systems export schema {version!r} (supported: {supported})")
    return str(version)


class _Reader:
    """An export's rows into per-process documents, counted as read."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.stats = dict.fromkeys(IMPORT_STAT_KEYS, 0)
        self.docs: dict[int, ProcessDoc] = {}
        self.strings: dict[int, str] = {
            int(i): clean(str(v)) for i, v in db.db.execute("SELECT id, value FROM StringIds")
        }
        self.base = 0
        if "TARGET_INFO_SESSION_START_TIME" in db.tables:
            self.base = as_int(db.scalar("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")) or 0
        self._quoted: dict[object, str] = {}

    def doc(self, pid: int) -> ProcessDoc:
        doc = self.docs.get(pid)
        if doc is None:
            doc = self.docs[pid] = ProcessDoc(pid)
        return doc

    def times(self, start: object, end: object) -> tuple[int, int] | None:
        s, e = as_int(start), as_int(end)
        if s is None or e is None or not valid_times(self.base + s, self.base + e):
            return None
        return self.base + s, self.base + max(s, e)

    def ignore(self) -> None:
        self.stats["ignored_events"] += 1

    def nvtx(self) -> None:
        ranges: dict[int, list[Range]] = {}
        cols = ("start", "end", "eventType", "text", "textId", "globalTid")
        for _, start, end, kind, text, text_id, gtid in self.db.rows(_NVTX, cols):
            self.stats["events_total"] += 1
            if kind == _NVTX_MARK:
                self.stats["nvtx_marks"] += 1
            t, gtid = self.times(start, end), as_int(gtid)
            if kind not in _NVTX_RANGES or gtid is None or t is None:
                self.ignore()  # marks, domain and thread records, unterminated ranges
                continue
            raw = text if text is not None else self.strings.get(as_int(text_id) or -1)
            r = Range(*t, tid_of(gtid), clean(str(raw)) if raw is not None else "")
            ranges.setdefault(pid_of(gtid), []).append(r)
            self.stats["nvtx_ranges"] += 1
        for pid, items in ranges.items():
            add_ranges(self.doc(pid), items, self.stats)

    def runtime(self) -> None:
        cols = ("start", "end", "eventClass", "globalTid", "correlationId", "nameId")
        primary: set[tuple[object, object]] = set()
        if _RUNTIME in self.db.tables and self.db.scalar(
            f"SELECT 1 FROM {_RUNTIME} WHERE eventClass = {_CLASS_BACKTRACE} LIMIT 1"
        ):
            primary = {
                (g, c)
                for _, g, c in self.db.rows(
                    _RUNTIME, ("globalTid", "correlationId"), f"WHERE eventClass != {_CLASS_BACKTRACE}"
                )
            }
        for _, start, end, klass, gtid, corr, name_id in self.db.rows(_RUNTIME, cols):
            self.stats["events_total"] += 1
            if klass == _CLASS_BACKTRACE and (gtid, corr) in primary:
                self.ignore()  # the same call again, with its call chain
                continue
            t, gtid = self.times(start, end), as_int(gtid)
            if gtid is None or t is None:
                self.ignore()
                continue
            name = self._quoted.get(("api", name_id))
            if name is None:
                text = _VERSION_SUFFIX.sub("", self.strings.get(as_int(name_id) or -1, "") or "cuda_runtime")
                name = self._quoted[("api", name_id)] = quote(text)
            cat = "cuda_driver" if klass == _CLASS_DRIVER else "cuda_runtime"
            args = members((("correlation", as_int(corr)),))
            self.doc(pid_of(gtid)).add(event(cat, name, pid_of(gtid), tid_of(gtid), *t, args), *t)
            self.stats["runtime_calls"] += 1

    def device(self) -> None:
        for table, extra, stat in (
            (_KERNEL, ("demangledName", "shortName", *_KERNEL_COLS), "kernels"),
            (MEMCPY, ("bytes", "copyKind", "srcKind", "dstKind"), "memcpys"),
            (MEMSET, ("bytes", "memKind"), "memsets"),
            (SYNC, ("syncType",), "syncs"),
        ):
            for row in self.db.rows(table, (*_DEVICE_COLS, "globalPid", *extra)):
                self.stats["events_total"] += 1
                start, end, device, context, stream, corr, gpid = row[1:8]
                t, gpid = self.times(start, end), as_int(gpid)
                if gpid is None or t is None:
                    self.ignore()
                    continue
                cat, name, own = self._device_fields(table, row[8:])
                text = device_event(cat, name, device, context, stream, corr, t, own)
                self.doc(pid_of(gpid)).add(text, *t)
                self.stats[stat] += 1

    def _device_fields(self, table: str, r: tuple[object, ...]) -> tuple[str, str, str]:
        """(category, quoted name, its own args) of a device row's table-specific columns."""
        if table == _KERNEL:
            key = ("kernel", r[0], r[1])
            name = self._quoted.get(key)
            if name is None:
                text = self.strings.get(as_int(r[0]) or -1) or self.strings.get(as_int(r[1]) or -1) or "kernel"
                name = self._quoted[key] = quote(text)
            return "kernel", name, kernel_args(*r[2:])
        return activity_fields(table, r)


def _convert(raw: sqlite3.Connection, path: Path, opts: ConvertOptions, engine: str) -> ConvertResult:
    db = Db(raw)
    if nvprof.is_nvprof(db.tables):
        return nvprof.convert(db, path, opts, engine)
    version = _schema_version(db, path)
    reader = _Reader(db)
    reader.nvtx()  # first: at equal times a range encloses the call it wraps (lower ordinal)
    reader.runtime()
    reader.device()
    if not reader.docs:
        raise TraceFormatError(f"{path}: no CUDA or NVTX events (Nsight Systems export schema {version})")
    reader.stats["processes"] = len(reader.docs)
    run_id = clean(opts.run_id) if opts.run_id is not None else f"nsys|{path.name}"
    names = _process_names(db)
    source = f"nsys-sqlite {version}"

    def process(pid: int) -> tuple[str, ResourceFacts]:
        exe = names.get(pid, "")
        return Path(exe).name or f"process {pid}", ResourceFacts(pid=pid, executable=exe, source_format=source)

    meta = file_meta(_host_name(db), _gpu_models(db))
    return convert_processes(reader.docs, meta, replace(opts, run_id=run_id), process, reader.stats, engine)


def _process_names(db: Db) -> dict[int, str]:
    if "PROCESSES" not in db.tables:
        return {}
    out: dict[int, str] = {}
    for gpid, pid, name in db.db.execute("SELECT globalPid, pid, name FROM PROCESSES"):
        if isinstance(name, str) and name:
            key = pid_of(gpid) if isinstance(gpid, int) else pid
            if isinstance(key, int):
                out.setdefault(key, clean(name))
    return out


def _host_name(db: Db) -> str | None:
    if "TARGET_INFO_SYSTEM_ENV" not in db.tables:
        return None
    value = db.scalar("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
    return clean(value) if isinstance(value, str) and value else None


def _gpu_models(db: Db) -> list[str]:
    if "TARGET_INFO_GPU" not in db.tables:
        return []
    return [clean(str(name)) for (name,) in db.db.execute("SELECT name FROM TARGET_INFO_GPU ORDER BY id") if name]


__all__ = ["SUPPORTED_MAJORS", "convert_nsys", "pid_of", "tid_of"]
