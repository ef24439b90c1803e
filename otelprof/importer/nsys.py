"""Nsight Systems SQLite exports (``nsys export --type sqlite``) -> OTLP spans.

Both export schema generations are read: 2.x (nsys 2021-2022: ``EXPORT_META_DATA``, runtime
rows duplicated as "CUDA backtrace" records) and 3.x (nsys 2023 on: ``META_DATA_EXPORT``).
Columns are looked up by name, so columns a generation adds or drops do not matter.

The span model follows docs/semantic-conventions.md ("Nsight Systems exports"): one trace per
profiled process, rooted at a synthetic process span; NVTX ranges and CUDA runtime/driver
calls nest by time per thread; kernels, memcpys, memsets and syncs hang under the runtime
call with their correlation id. Spans are cut to the converter's length limits and encoded by
the reference encoder, so they are the same OTLP the Kineto converter writes, within the same
request size. Ids derive from (run id, rank, file name, pid, table, row id), before any cut:
importing the same file twice gives the same ids.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from ..converter import ConvertOptions, ConvertResult, TraceFormatError
from ..converter._options import SPAN_NAME_LENGTH_LIMIT
from ..otlp import ids
from ..otlp._text import clean
from ..otlp.encoder import encode
from ..otlp.names import cut_strings, fold_kernel_name
from ..otlp.resource import ResourceFacts
from ..otlp.spans import Attrs, Span
from . import nvtx_markup
from .nvtx_markup import OpMarkup

SUPPORTED_MAJORS = (2, 3)
_META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # 3.x, 2.x
_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
_MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
_MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
_SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
_NVTX = "NVTX_EVENTS"
#: Span-id namespaces: each table's row ids are unique only within the table.
_TABLE_CODE = {
    _RUNTIME: 1, _KERNEL: 2, _MEMCPY: 3, _MEMSET: 4, _SYNC: 5, _NVTX: 6,
    # nvprof's own tables (importer/nvprof.py)
    "CUPTI_ACTIVITY_KIND_DRIVER": 7, "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL": 8, "CUPTI_ACTIVITY_KIND_MARKER": 9,
}  # fmt: skip

# ENUM_NSYS_EVENT_CLASS / ENUM_NSYS_EVENT_TYPE values (the same in both generations; 2.x
# exports do not carry the enum tables, so they are spelled out here).
_CLASS_CATEGORY = {0: "cuda_runtime", 1: "cuda_driver"}
_CLASS_BACKTRACE = 67  # 2.x: a second row per call holding its call chain
_NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
_NVTX_MARK = 34
_NVTX_DOMAIN_CREATE = 75
# ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_MEM_KIND, ENUM_CUPTI_SYNC_TYPE, named as Kineto names them
_COPY_KIND = {
    1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
    10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD",
}  # fmt: skip
_MEM_KIND = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static", 6: "Managed Static",
}  # fmt: skip
_SYNC_KIND = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
_VERSION_SUFFIX = re.compile(r"_v[0-9]+\Z")  # cudaMalloc_v3020 -> cudaMalloc, as nsys shows it

STAT_KEYS = (
    "events_total", "runtime_calls", "kernels", "memcpys", "memsets", "syncs", "nvtx_ranges", "nvtx_marks",
    "nvtx_ops", "links", "ignored_events", "device_events_unlinked", "processes", "spans", "synthetic_spans",
    "requests", "values_truncated",
)  # fmt: skip


def pid_of(global_id: int) -> int:
    """nsys GlobalId: hardware (8 bits) | VM (8) | pid (24) | tid (24)."""
    return (global_id >> 24) & 0xFFFFFF


def tid_of(global_id: int) -> int:
    return global_id & 0xFFFFFF


@dataclass
class _Item:
    """One row that becomes a span."""

    table: str
    rowid: int
    name: str
    start: int
    end: int
    pid: int
    tid: int  # -1 for device work
    correlation: int | None
    attrs: Attrs
    parent: _Item | None = None
    span_id: bytes = b""
    op: OpMarkup | None = None  # emit_nvtx markup of an NVTX range
    link: _Item | None = None  # a backward op's forward op


@dataclass
class _Process:
    pid: int
    cpu: list[_Item] = field(default_factory=list)
    device: list[_Item] = field(default_factory=list)


def convert_nsys(path: str | Path, options: ConvertOptions) -> ConvertResult:
    """Read an Nsight Systems SQLite export; raises TraceFormatError with a one-line reason."""
    path = Path(path)
    try:
        with closing(_connect(path)) as db:
            return _convert(db, path, options)
    except sqlite3.Error as exc:  # not a database, truncated, malformed
        raise TraceFormatError(f"{path}: not a readable SQLite database ({exc})") from None


def _connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise TraceFormatError(f"{path}: cannot read (not a file)")
    if path.stat().st_size == 0:
        raise TraceFormatError(f"{path}: empty file (not an Nsight Systems SQLite export)")
    # read-only and immutable: works on read-only media and never writes a journal
    return sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1", uri=True)


class _Db:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self.db.execute(f'PRAGMA table_info("{table}")')}

    def rows(self, table: str, wanted: tuple[str, ...]) -> Iterator[dict[str, object]]:
        """Rows as dicts of the wanted columns that exist (missing ones read as None)."""
        if table not in self.tables:
            return
        have = self.columns(table)
        cols = [c for c in wanted if c in have]
        sql = f'SELECT rowid, {", ".join(cols)} FROM "{table}" ORDER BY rowid'
        for row in self.db.execute(sql):
            out: dict[str, object] = dict.fromkeys(wanted)
            out["rowid"] = row[0]
            out.update(zip(cols, row[1:], strict=True))
            yield out

    def scalar(self, sql: str) -> object:
        row = self.db.execute(sql).fetchone()
        return row[0] if row else None


def _schema_version(db: _Db, path: Path) -> str:
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


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _convert(raw: sqlite3.Connection, path: Path, opts: ConvertOptions) -> ConvertResult:
    db = _Db(raw)
    from . import nvprof  # imports this module

    if nvprof.is_nvprof(db.tables):
        return nvprof.convert(db, path, opts)
    version = _schema_version(db, path)
    stats = dict.fromkeys(STAT_KEYS, 0)
    strings: dict[int, str] = {int(i): clean(str(v)) for i, v in db.db.execute("SELECT id, value FROM StringIds")}
    base_ns = (
        _int(db.scalar("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME"))
        if ("TARGET_INFO_SESSION_START_TIME" in db.tables)
        else None
    )
    base = base_ns or 0
    procs: dict[int, _Process] = {}

    def proc(pid: int) -> _Process:
        return procs.setdefault(pid, _Process(pid))

    def times(row: dict[str, object]) -> tuple[int, int] | None:
        start, end = _int(row["start"]), _int(row["end"])
        if start is None or end is None:
            return None
        return base + start, base + max(start, end)

    # --- CPU side: runtime/driver calls --------------------------------------------------
    runtime_rows = list(db.rows(_RUNTIME, ("start", "end", "eventClass", "globalTid", "correlationId", "nameId")))
    has_primary = {(r["globalTid"], r["correlationId"]) for r in runtime_rows if r["eventClass"] != _CLASS_BACKTRACE}
    launches: dict[tuple[int, int], _Item] = {}
    for r in runtime_rows:
        stats["events_total"] += 1
        klass, gtid, t = _int(r["eventClass"]), _int(r["globalTid"]), times(r)
        if klass == _CLASS_BACKTRACE and (r["globalTid"], r["correlationId"]) in has_primary:
            stats["ignored_events"] += 1  # the same call again, with its call chain
            continue
        if gtid is None or t is None:
            stats["ignored_events"] += 1
            continue
        name = _VERSION_SUFFIX.sub("", strings.get(_int(r["nameId"]) or -1, "") or "cuda_runtime")
        corr = _int(r["correlationId"])
        attrs: Attrs = [("pytorch.event.category", _CLASS_CATEGORY.get(klass or 0, "cuda_runtime"))]
        attrs.append(("thread.id", tid_of(gtid)))
        if corr is not None:
            attrs.append(("pytorch.gpu.correlation_id", corr))
        item = _Item(_RUNTIME, int(str(r["rowid"])), name, *t, pid_of(gtid), tid_of(gtid), corr, attrs)
        proc(item.pid).cpu.append(item)
        if corr is not None:
            launches.setdefault((item.pid, corr), item)
        stats["runtime_calls"] += 1

    # --- CPU side: NVTX ranges -----------------------------------------------------------
    nvtx_rows = list(db.rows(_NVTX, ("start", "end", "eventType", "text", "textId", "globalTid", "domainId")))
    domains = {
        _int(r["domainId"]): clean(str(r["text"]))
        for r in nvtx_rows
        if r["eventType"] == _NVTX_DOMAIN_CREATE and r["text"] is not None
    }
    for r in nvtx_rows:
        stats["events_total"] += 1
        kind, gtid, t = _int(r["eventType"]), _int(r["globalTid"]), times(r)
        if kind == _NVTX_MARK:
            stats["nvtx_marks"] += 1
        if kind not in _NVTX_RANGES or gtid is None or t is None or r["end"] is None:
            stats["ignored_events"] += 1
            continue
        text = r["text"] if r["text"] is not None else strings.get(_int(r["textId"]) or -1)
        attrs = [("pytorch.event.category", "nvtx"), ("thread.id", tid_of(gtid))]
        domain = domains.get(_int(r["domainId"]))
        if domain:
            attrs.append(("nvtx.domain", domain))
        item = nvtx_item(_NVTX, int(str(r["rowid"])), text, t, pid_of(gtid), tid_of(gtid), attrs)
        proc(item.pid).cpu.append(item)
        stats["nvtx_ranges"] += 1

    # --- device side ---------------------------------------------------------------------
    device_cols = ("start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid")
    kernel_cols = (
        *device_cols, "demangledName", "shortName", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ",
        "registersPerThread", "staticSharedMemory", "dynamicSharedMemory",
    )  # fmt: skip
    for table, cols, stat in (
        (_KERNEL, kernel_cols, "kernels"),
        (_MEMCPY, (*device_cols, "bytes", "copyKind", "srcKind", "dstKind"), "memcpys"),
        (_MEMSET, (*device_cols, "bytes", "memKind"), "memsets"),
        (_SYNC, (*device_cols, "syncType"), "syncs"),
    ):
        for r in db.rows(table, cols):
            stats["events_total"] += 1
            gpid, t = _int(r["globalPid"]), times(r)
            if gpid is None or t is None:
                stats["ignored_events"] += 1
                continue
            corr = _int(r["correlationId"])
            name, attrs = device_span(table, r, strings, corr)
            item = _Item(table, int(str(r["rowid"])), name, *t, pid_of(gpid), -1, corr, attrs)
            proc(item.pid).device.append(item)
            stats[stat] += 1

    if not procs:
        raise TraceFormatError(f"{path}: no CUDA or NVTX events (Nsight Systems export schema {version})")

    # --- tree, ids, spans ----------------------------------------------------------------
    run_id = clean(opts.run_id) if opts.run_id is not None else f"nsys|{path.name}"
    process_names = _process_names(db)
    host = _host_name(db) or opts.host_name
    gpus = _gpu_models(db)

    def resource(pid: int) -> tuple[Attrs, int]:
        exe = process_names.get(pid, "")
        return _resource(opts, run_id, pid, exe, host, gpus, f"nsys-sqlite {version}")

    requests = build_requests(procs, launches, path, opts, run_id, "nsys", process_names, resource, stats)
    return ConvertResult(requests, [], stats, "nsys")


def nvtx_item(table: str, rowid: int, text: object, t: tuple[int, int], pid: int, tid: int, attrs: Attrs) -> _Item:
    """An NVTX range; ``emit_nvtx`` markup becomes the op's name, attributes and category."""
    raw = clean(str(text)) if text is not None else ""
    op = nvtx_markup.parse(raw) if raw else None
    if op is not None:
        attrs[0] = ("pytorch.event.category", "cpu_op")
        attrs.extend(op.attributes())
    name = op.name if op is not None else (raw or "nvtx range")
    return _Item(table, rowid, name, *t, pid, tid, None, attrs, op=op)


def build_requests(
    procs: dict[int, _Process],
    launches: dict[tuple[int, int], _Item],
    path: Path,
    opts: ConvertOptions,
    run_id: str,
    prefix: str,
    process_names: dict[int, str],
    resource: Callable[[int], tuple[Attrs, int]],
    stats: dict[str, int],
) -> list[bytes]:
    """Nest, link and encode each process's items as one trace (shared with the nvprof reader).
    Names and values are cut as the converter cuts them (a 5M-character NVTX range is 8,192
    characters, as in a Kineto trace), so no request is over ``max_request_bytes`` but for one
    span that alone is."""
    rank_s = "" if opts.rank is None else str(opts.rank)
    requests: list[bytes] = []
    for pid in sorted(procs):
        p = procs[pid]
        trace_id = ids.trace_id(f"{prefix}|{run_id}|{rank_s}|{clean(path.name)}|{pid}")
        base_id = ids.span_base(f"{run_id}|{clean(path.name)}", f"{rank_s}|{pid}")
        for item in p.cpu + p.device:
            item.span_id = ids.span_id(base_id, (_TABLE_CODE[item.table] << 40) + item.rowid)
        _nest(p.cpu)
        stats["links"] += _link_backward(p.cpu)
        stats["nvtx_ops"] += sum(1 for i in p.cpu if i.op is not None)
        for item in p.device:
            launch = launches.get((pid, item.correlation)) if item.correlation is not None else None
            item.parent = launch
            if launch is None:
                stats["device_events_unlinked"] += 1
        members = p.cpu + p.device
        exe = process_names.get(pid, "")
        root = Span(
            -1,
            trace_id,
            ids.span_id(base_id, 0),
            b"",
            Path(exe).name or f"process {pid}",
            min(i.start for i in members),
            max(i.end for i in members),
            [("pytorch.event.category", "otelprof"), ("otelprof.synthetic", True)],
        )
        spans = [root]
        for k, item in enumerate(sorted(members, key=lambda i: (i.start, -i.end, _TABLE_CODE[i.table], i.rowid))):
            parent_id = item.parent.span_id if item.parent is not None else root.span_id
            span = Span(k, trace_id, item.span_id, parent_id, item.name, item.start, item.end, item.attrs)
            if item.link is not None:
                span.links = [(trace_id, item.link.span_id, [("otelprof.link.kind", "fwdbwd")])]
            spans.append(span)
        stats["spans"] += len(spans)
        stats["synthetic_spans"] += 1
        stats["values_truncated"] += cut_strings(spans, SPAN_NAME_LENGTH_LIMIT, opts.attribute_value_length_limit)
        attrs, cut = resource(pid)
        stats["values_truncated"] += cut
        requests.extend(encode(spans, attrs, opts.scope_version, opts.max_request_bytes))
    stats["processes"] = len(procs)
    stats["requests"] = len(requests)
    return requests


def _link_backward(cpu: list[_Item]) -> int:
    """Backward op with sequence number M -> the last op with sequence number M that started
    before it in the same process and is not itself a backward op (Kineto's rule, without
    Kineto's ``Fwd thread id``: see nvtx_markup.is_backward). Returns the links made."""
    last_forward: dict[int, _Item] = {}
    made = 0
    for item in sorted(cpu, key=lambda i: (i.start, -i.end, -_TABLE_CODE[i.table], i.rowid)):
        op = item.op
        if op is None or op.sequence_number is None:
            continue
        parent_name = item.parent.name if item.parent is not None else None
        if nvtx_markup.is_backward(op, parent_name):
            fwd = last_forward.get(op.sequence_number)
            if fwd is not None:
                item.link = fwd
                made += 1
        else:
            last_forward[op.sequence_number] = item
    return made


def kernel_span_name(name: str, attrs: Attrs) -> str:
    """A kernel's span name, folded as the converter folds Kineto's (``fold_kernel_name``); the
    full name is appended to ``attrs`` as ``pytorch.gpu.kernel_name`` when the two differ."""
    folded = fold_kernel_name(name)
    if folded != name:
        attrs.append(("pytorch.gpu.kernel_name", name))
    return folded


def device_span(
    table: str,
    r: dict[str, object],
    strings: dict[int, str],
    corr: int | None,
    demangle: Callable[[str], str] | None = None,
) -> tuple[str, Attrs]:
    """The span name and attributes of a device activity row (nsys's columns; nvprof's rows are
    renamed to them first): category, folded kernel name, correlation id, device, stream, context
    and the table's own fields."""
    name, category, extra = _device_fields(table, r, strings)
    attrs: Attrs = [("pytorch.event.category", category)]
    if category == "kernel":
        name = kernel_span_name(demangle(name) if demangle else name, attrs)
    if corr is not None:
        attrs.append(("pytorch.gpu.correlation_id", corr))
    for key, col in (("device", "deviceId"), ("stream", "streamId"), ("context", "contextId")):
        if (v := _int(r[col])) is not None:
            attrs.append((f"pytorch.gpu.{key}", v))
    attrs.extend(extra)
    return name, attrs


def _device_fields(table: str, r: dict[str, object], strings: dict[int, str]) -> tuple[str, str, Attrs]:
    extra: Attrs = []
    if table == _KERNEL:
        name = strings.get(_int(r["demangledName"]) or -1) or strings.get(_int(r["shortName"]) or -1) or "kernel"
        grid = [_int(r[c]) for c in ("gridX", "gridY", "gridZ")]
        block = [_int(r[c]) for c in ("blockX", "blockY", "blockZ")]
        if None not in grid:
            extra.append(("pytorch.gpu.grid", json.dumps(grid, separators=(",", ":"))))
        if None not in block:
            extra.append(("pytorch.gpu.block", json.dumps(block, separators=(",", ":"))))
        if (regs := _int(r["registersPerThread"])) is not None:
            extra.append(("pytorch.gpu.registers_per_thread", regs))
        shared = [_int(r[c]) for c in ("staticSharedMemory", "dynamicSharedMemory")]
        if None not in shared:
            extra.append(("pytorch.gpu.shared_memory_bytes", sum(s for s in shared if s is not None)))
        return name, "kernel", extra
    if (nbytes := _int(r.get("bytes"))) is not None:
        extra.append(("pytorch.gpu.bytes", nbytes))
    if table == _MEMCPY:
        kind = _COPY_KIND.get(_int(r["copyKind"]) or 0, "Unknown")
        src, dst = _mem_kind(r["srcKind"]), _mem_kind(r["dstKind"])
        name = f"Memcpy {kind} ({src} -> {dst})" if src and dst else f"Memcpy {kind}"
        return name, "gpu_memcpy", extra
    if table == _MEMSET:
        mem = _mem_kind(r["memKind"])
        return (f"Memset ({mem})" if mem else "Memset"), "gpu_memset", extra
    sync = _SYNC_KIND.get(_int(r["syncType"]) or 0, "Unknown Sync")
    extra.append(("pytorch.gpu.sync_kind", sync))
    return sync, "cuda_sync", extra


def _mem_kind(value: object) -> str | None:
    kind = _int(value)  # 0 is Pageable
    return _MEM_KIND.get(kind) if kind is not None else None


def _nest(cpu: list[_Item]) -> None:
    """Time containment per thread, torch's rule (EventList._populate_cpu_children): sorted by
    (start, -end), a candidate parent is popped when the event starts at or after its end or
    ends after it."""
    by_thread: dict[int, list[_Item]] = defaultdict(list)
    for item in cpu:
        by_thread[item.tid].append(item)
    for items in by_thread.values():
        stack: list[_Item] = []
        # at equal times an NVTX range encloses the runtime call it wraps
        for item in sorted(items, key=lambda i: (i.start, -i.end, -_TABLE_CODE[i.table], i.rowid)):
            while stack and (item.start >= stack[-1].end or item.end > stack[-1].end):
                stack.pop()
            item.parent = stack[-1] if stack else None
            stack.append(item)


def _process_names(db: _Db) -> dict[int, str]:
    if "PROCESSES" not in db.tables:
        return {}
    out: dict[int, str] = {}
    for gpid, pid, name in db.db.execute("SELECT globalPid, pid, name FROM PROCESSES"):
        if isinstance(name, str) and name:
            key = pid_of(gpid) if isinstance(gpid, int) else pid
            if isinstance(key, int):
                out.setdefault(key, clean(name))
    return out


def _host_name(db: _Db) -> str | None:
    if "TARGET_INFO_SYSTEM_ENV" not in db.tables:
        return None
    value = db.scalar("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
    return clean(value) if isinstance(value, str) and value else None


def _gpu_models(db: _Db) -> list[str]:
    if "TARGET_INFO_GPU" not in db.tables:
        return []
    return [clean(str(name)) for (name,) in db.db.execute("SELECT name FROM TARGET_INFO_GPU ORDER BY id") if name]


def _resource(
    opts: ConvertOptions, run_id: str, pid: int, exe: str, host: str | None, gpus: list[str], source: str
) -> tuple[Attrs, int]:
    """A process's resource, its values from the file cut as a Kineto trace's are; and how many
    were cut."""
    facts = ResourceFacts(
        host_name=host,
        pid=pid,
        executable=exe,
        rank=opts.rank,
        world_size=opts.world_size,
        gpu_models=gpus,
        run_id=run_id,
        source_format=source,
    )
    return opts.resource(facts)


__all__ = ["STAT_KEYS", "SUPPORTED_MAJORS", "convert_nsys", "pid_of", "tid_of"]
