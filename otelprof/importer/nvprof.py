"""nvprof profiles (``nvprof -o trace.nvvp``, SQLite) -> OTLP spans, as the nsys reader builds them.

nvprof writes CUPTI activity records one table per kind (``CUPTI_ACTIVITY_KIND_RUNTIME``,
``..._CONCURRENT_KERNEL``, ``..._MARKER`` …) with strings in ``StringTable``; this is the format
``torch.autograd.profiler.load_nvprof`` reads. NVTX ranges are ``MARKER`` rows in pairs, a
start (flags 2, with the name) and an end (flags 4, name 0) sharing ``id``; the thread is the
``objectId`` blob (little-endian uint32 process id, uint32 thread id). Runtime and driver rows
carry only the callback id (``cbid``), named here from CUPTI's ``cupti_runtime_cbid.h`` /
``cupti_driver_cbid.h`` for the calls that launch or wait for device work. Times are CUPTI
nanoseconds, used as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct
from pathlib import Path
from typing import Any

from ..converter import ConvertOptions, ConvertResult, TraceFormatError
from ..otlp._text import clean
from ..otlp.spans import Attrs
from .nsys import (
    STAT_KEYS,
    _Db,
    _Item,
    _Process,
    _resource,
    build_requests,
    device_span,
    nvtx_item,
)

_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
_DRIVER = "CUPTI_ACTIVITY_KIND_DRIVER"
_KERNELS = ("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", "CUPTI_ACTIVITY_KIND_KERNEL")
_MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
_MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
_SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
_MARKER = "CUPTI_ACTIVITY_KIND_MARKER"
_FLAG_INSTANT, _FLAG_START, _FLAG_END = 1, 2, 4  # CUpti_ActivityFlag for markers

#: CUpti_runtime_api_trace_cbid / CUpti_driver_api_trace_cbid: the calls that launch, copy,
#: set or wait (others are named by their id).
_RUNTIME_NAMES = {
    13: "cudaLaunch", 31: "cudaMemcpy", 32: "cudaMemcpy2D", 39: "cudaMemcpyToSymbol", 40: "cudaMemcpyFromSymbol",
    41: "cudaMemcpyAsync", 44: "cudaMemcpy2DAsync", 47: "cudaMemcpyToSymbolAsync",
    48: "cudaMemcpyFromSymbolAsync", 49: "cudaMemset", 50: "cudaMemset2D", 51: "cudaMemsetAsync",
    52: "cudaMemset2DAsync", 126: "cudaThreadSynchronize", 131: "cudaStreamSynchronize",
    137: "cudaEventSynchronize", 144: "cudaMemcpy3D", 145: "cudaMemcpy3DAsync", 147: "cudaStreamWaitEvent",
    160: "cudaMemcpyPeer", 161: "cudaMemcpyPeerAsync", 165: "cudaDeviceSynchronize", 211: "cudaLaunchKernel",
    214: "cudaLaunchKernel_ptsz", 215: "cudaMemcpy_ptds", 225: "cudaMemcpyAsync_ptsz", 233: "cudaMemset_ptds",
    235: "cudaMemsetAsync_ptsz", 239: "cudaStreamSynchronize_ptsz", 247: "cudaStreamWaitEvent_ptsz",
    269: "cudaLaunchCooperativeKernel", 284: "cudaLaunchHostFunc",
}  # fmt: skip
_DRIVER_NAMES = {
    17: "cuCtxSynchronize", 121: "cuEventSynchronize", 126: "cuStreamSynchronize", 276: "cuMemcpyHtoD",
    277: "cuMemcpyHtoDAsync", 278: "cuMemcpyDtoH", 279: "cuMemcpyDtoHAsync", 280: "cuMemcpyDtoD",
    281: "cuMemcpyDtoDAsync", 295: "cuStreamWaitEvent", 305: "cuMemcpy", 306: "cuMemcpyAsync",
    307: "cuLaunchKernel", 442: "cuLaunchKernel_ptsz", 477: "cuLaunchCooperativeKernel", 514: "cuGraphLaunch",
    652: "cuLaunchKernelEx",
}  # fmt: skip


def is_nvprof(tables: set[str]) -> bool:
    """nvprof's tables: ``StringTable`` and CUPTI activity kinds (nsys has ``StringIds``)."""
    return "StringTable" in tables and any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in tables)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _thread(kind: object, blob: object) -> tuple[int, int] | None:
    """(pid, tid) of a marker's objectId: CUpti_ActivityObjectKindId, process (1) or thread (2)."""
    if not isinstance(blob, bytes) or len(blob) < 8 or kind not in (1, 2):
        return None
    pid, tid = struct.unpack_from("<II", blob)
    return pid, (tid if kind == 2 else 0)


@functools.cache
def _cxa_demangle() -> Any:
    """libstdc++'s ``__cxa_demangle`` (nvprof stores kernel names mangled), or None."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    return fn


def demangle(name: str) -> str:
    fn = _cxa_demangle() if name.startswith("_Z") else None
    if fn is None:
        return name
    status = ctypes.c_int(-1)
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace") if status.value == 0 else name
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))


def convert(db: _Db, path: Path, opts: ConvertOptions) -> ConvertResult:
    stats = dict.fromkeys(STAT_KEYS, 0)
    strings = {int(i): clean(str(v)) for i, v in db.db.execute("SELECT _id_, value FROM StringTable")}
    procs: dict[int, _Process] = {}
    launches: dict[tuple[int, int], _Item] = {}
    launch_pid: dict[int, int] = {}

    def proc(pid: int) -> _Process:
        return procs.setdefault(pid, _Process(pid))

    def times(r: dict[str, object], start: str = "start", end: str = "end") -> tuple[int, int] | None:
        s, e = _int(r[start]), _int(r[end])
        return None if s is None or e is None else (s, max(s, e))

    # --- runtime and driver calls ----------------------------------------------------------
    for table, category, names in ((_RUNTIME, "cuda_runtime", _RUNTIME_NAMES), (_DRIVER, "cuda_driver", _DRIVER_NAMES)):
        for r in db.rows(table, ("cbid", "start", "end", "processId", "threadId", "correlationId")):
            stats["events_total"] += 1
            pid, tid, cbid, t = _int(r["processId"]), _int(r["threadId"]), _int(r["cbid"]), times(r)
            if pid is None or tid is None or t is None:
                stats["ignored_events"] += 1
                continue
            tid &= 0xFFFFFFFF  # stored signed
            name = names.get(cbid or -1) or f"{category} cbid {cbid}"
            corr = _int(r["correlationId"])
            attrs: Attrs = [("pytorch.event.category", category), ("thread.id", tid)]
            if corr is not None:
                attrs.append(("pytorch.gpu.correlation_id", corr))
            if cbid is not None:
                attrs.append(("pytorch.gpu.cbid", cbid))
            item = _Item(table, int(str(r["rowid"])), name, *t, pid, tid, corr, attrs)
            proc(pid).cpu.append(item)
            if corr is not None:
                launches.setdefault((pid, corr), item)
                launch_pid.setdefault(corr, pid)
            stats["runtime_calls"] += 1

    # --- NVTX ranges: start/end marker pairs ------------------------------------------------
    starts: dict[int, dict[str, object]] = {}
    ends: dict[int, int] = {}
    for r in db.rows(_MARKER, ("flags", "timestamp", "id", "objectKind", "objectId", "name", "domain")):
        stats["events_total"] += 1
        flags, mid = _int(r["flags"]) or 0, _int(r["id"])
        if mid is not None and flags & _FLAG_START and r["name"] != 0:
            starts[mid] = r
        elif mid is not None and flags & _FLAG_END and (ts := _int(r["timestamp"])) is not None:
            ends[mid] = ts
        else:
            stats["nvtx_marks" if flags & _FLAG_INSTANT else "ignored_events"] += 1
    for mid, r in starts.items():
        where, start = _thread(r["objectKind"], r["objectId"]), _int(r["timestamp"])
        if where is None or start is None or mid not in ends:
            stats["ignored_events"] += 1  # unterminated, or not on a thread
            continue
        attrs = [("pytorch.event.category", "nvtx"), ("thread.id", where[1])]
        if (domain := strings.get(_int(r["domain"]) or 0)) is not None:
            attrs.append(("nvtx.domain", domain))
        text = strings.get(_int(r["name"]) or -1)
        item = nvtx_item(_MARKER, int(str(r["rowid"])), text, (start, max(start, ends[mid])), *where, attrs)
        proc(item.pid).cpu.append(item)
        stats["nvtx_ranges"] += 1
    stats["events_total"] -= len(ends)  # a range is one event, as in nsys

    # --- device work --------------------------------------------------------------------------
    device = ("start", "end", "deviceId", "contextId", "streamId", "correlationId")
    grid = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")
    kernel = (*device, "name", *grid, "registersPerThread", "staticSharedMemory", "dynamicSharedMemory")
    specs: list[tuple[str, tuple[str, ...], str]] = [(t, kernel, "kernels") for t in _KERNELS]
    specs += [(_MEMCPY, (*device, "bytes", "copyKind", "srcKind", "dstKind"), "memcpys")]
    specs += [(_MEMSET, (*device, "bytes", "memoryKind"), "memsets"), (_SYNC, (*device, "type"), "syncs")]
    fallback_pid = min(procs) if procs else None
    for table, cols, stat in specs:
        for r in db.rows(table, cols):
            stats["events_total"] += 1
            t, corr = times(r), _int(r["correlationId"])
            pid = launch_pid.get(corr, fallback_pid) if corr is not None else fallback_pid
            if t is None or pid is None:
                stats["ignored_events"] += 1
                continue
            name, attrs = device_span(_nsys_table(table), _as_nsys_row(r), strings, corr, demangle)
            proc(pid).device.append(_Item(table, int(str(r["rowid"])), name, *t, pid, -1, corr, attrs))
            stats[stat] += 1

    if not procs:
        raise TraceFormatError(f"{path}: no CUDA or NVTX events (nvprof profile)")
    version = db.scalar("SELECT version FROM Version") if "Version" in db.tables else None
    source = f"nvprof-sqlite {version}" if version is not None else "nvprof-sqlite"
    run_id = clean(opts.run_id) if opts.run_id is not None else f"nvprof|{path.name}"
    gpus = _gpu_models(db, strings)

    def resource(pid: int) -> tuple[Attrs, int]:
        return _resource(opts, run_id, pid, "", opts.host_name, gpus, source)

    requests = build_requests(procs, launches, path, opts, run_id, "nvprof", {}, resource, stats)
    return ConvertResult(requests, [], stats, "nvprof")


def _nsys_table(table: str) -> str:
    return "CUPTI_ACTIVITY_KIND_KERNEL" if table in _KERNELS else table


def _as_nsys_row(r: dict[str, object]) -> dict[str, object]:
    """nvprof's columns under nsys's names; CUPTI memory kinds count from 1 (0 = unknown),
    nsys's from 0."""
    out = dict(r)
    out["demangledName"], out["shortName"], out["syncType"] = r.get("name"), None, r.get("type")
    for src, dst in (("srcKind", "srcKind"), ("dstKind", "dstKind"), ("memoryKind", "memKind")):
        kind = _int(r.get(src))
        out[dst] = kind - 1 if kind else None  # None: unknown
    return out


def _gpu_models(db: _Db, strings: dict[int, str]) -> list[str]:
    if "CUPTI_ACTIVITY_KIND_DEVICE" not in db.tables:
        return []
    rows = db.db.execute("SELECT name FROM CUPTI_ACTIVITY_KIND_DEVICE ORDER BY id")
    return [strings[n] for (n,) in rows if isinstance(n, int) and n in strings]


__all__ = ["convert", "demangle", "is_nvprof"]
