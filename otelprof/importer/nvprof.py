"""nvprof profiles (``nvprof -o trace.nvvp``, SQLite) -> OTLP spans, as Kineto traces like nsys exports.

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
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..converter import ConvertOptions, ConvertResult, TraceFormatError
from ..otlp._text import clean
from ..otlp.resource import ResourceFacts
from ._cupti import MEM_KIND, Db, activity_fields, as_int, device_event, kernel_args
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


class _Reader:
    """A profile's rows into per-process documents, counted as read."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.stats = dict.fromkeys(IMPORT_STAT_KEYS, 0)
        self.docs: dict[int, ProcessDoc] = {}
        self.strings = {int(i): clean(str(v)) for i, v in db.db.execute("SELECT _id_, value FROM StringTable")}
        self.launch_pid: dict[int, int] = {}  # correlation id -> the process of its call
        self._kernel_names: dict[object, str] = {}

    def doc(self, pid: int) -> ProcessDoc:
        doc = self.docs.get(pid)
        if doc is None:
            doc = self.docs[pid] = ProcessDoc(pid)
        return doc

    def markers(self) -> None:
        """NVTX ranges: start/end marker pairs."""
        starts: dict[int, tuple[object, ...]] = {}
        ends: dict[int, int] = {}
        for r in self.db.rows(_MARKER, ("flags", "timestamp", "id", "objectKind", "objectId", "name")):
            self.stats["events_total"] += 1
            flags, mid = as_int(r[1]) or 0, as_int(r[3])
            if mid is not None and flags & _FLAG_START and r[6] != 0 and mid not in starts:
                starts[mid] = r
            elif mid is not None and flags & _FLAG_END and (ts := as_int(r[2])) is not None and mid not in ends:
                ends[mid] = ts
            else:  # instantaneous markers, repeated or malformed rows
                self.stats["ignored_events"] += 1
                self.stats["nvtx_marks"] += bool(flags & _FLAG_INSTANT)
        self.stats["events_total"] -= len(ends)  # a range is one event, as in nsys
        ranges: dict[int, list[Range]] = {}
        for mid, r in starts.items():
            where, t = _thread(r[4], r[5]), _times(r[2], ends.get(mid))
            if where is None or t is None:
                self.stats["ignored_events"] += 1  # unterminated, or not on a thread
                continue
            text = self.strings.get(as_int(r[6]) or -1, "")
            ranges.setdefault(where[0], []).append(Range(*t, where[1], text))
            self.stats["nvtx_ranges"] += 1
        for pid, items in ranges.items():
            add_ranges(self.doc(pid), items, self.stats)

    def calls(self) -> None:
        """Runtime and driver calls."""
        cols = ("cbid", "start", "end", "processId", "threadId", "correlationId")
        for table, category, names in (
            (_RUNTIME, "cuda_runtime", _RUNTIME_NAMES),
            (_DRIVER, "cuda_driver", _DRIVER_NAMES),
        ):
            for _, raw_cbid, start, end, raw_pid, raw_tid, raw_corr in self.db.rows(table, cols):
                self.stats["events_total"] += 1
                pid, tid, cbid, corr, t = (
                    as_int(raw_pid),
                    as_int(raw_tid),
                    as_int(raw_cbid),
                    as_int(raw_corr),
                    _times(start, end),
                )
                if pid is None or tid is None or t is None:
                    self.stats["ignored_events"] += 1
                    continue
                name = names.get(cbid or -1) or f"{category} cbid {cbid}"
                args = members((("correlation", corr), ("cbid", cbid)))
                self.doc(pid).add(event(category, quote(name), pid, tid & 0xFFFFFFFF, *t, args), *t)  # stored signed
                if corr is not None:
                    self.launch_pid.setdefault(corr, pid)
                self.stats["runtime_calls"] += 1

    def device(self) -> None:
        """Device work, each row in its call's process (else the lowest pid)."""
        device = ("start", "end", "deviceId", "contextId", "streamId", "correlationId")
        grid = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")
        kernel = (*device, "name", *grid, "registersPerThread", "staticSharedMemory", "dynamicSharedMemory")
        specs: list[tuple[str, tuple[str, ...], str]] = [(t, kernel, "kernels") for t in _KERNELS]
        specs += [(_MEMCPY, (*device, "bytes", "copyKind", "srcKind", "dstKind"), "memcpys")]
        specs += [(_MEMSET, (*device, "bytes", "memoryKind"), "memsets"), (_SYNC, (*device, "type"), "syncs")]
        fallback = min(self.docs) if self.docs else None
        for table, cols, stat in specs:
            for r in self.db.rows(table, cols):
                self.stats["events_total"] += 1
                t, corr = _times(r[1], r[2]), as_int(r[6])
                pid = self.launch_pid.get(corr, fallback) if corr is not None else fallback
                if t is None or pid is None:
                    self.stats["ignored_events"] += 1
                    continue
                if table in _KERNELS:
                    cat, name, own = "kernel", self._kernel_name(r[7]), kernel_args(*r[8:])
                else:
                    cat, name, own = activity_fields(table, r[7:], _mem_kind)
                self.doc(pid).add(device_event(cat, name, r[3], r[4], r[5], corr, t, own), *t)
                self.stats[stat] += 1

    def _kernel_name(self, string_id: object) -> str:
        name = self._kernel_names.get(string_id)
        if name is None:
            text = demangle(self.strings.get(as_int(string_id) or -1) or "kernel")
            name = self._kernel_names[string_id] = quote(text)
        return name


def _times(start: object, end: object) -> tuple[int, int] | None:
    """CUPTI nanoseconds, used as they are."""
    s, e = as_int(start), as_int(end)
    return None if s is None or e is None or not valid_times(s, e) else (s, max(s, e))


def convert(db: Db, path: Path, opts: ConvertOptions, engine: str = "auto") -> ConvertResult:
    reader = _Reader(db)
    reader.markers()  # first: at equal times a range encloses the call it wraps (lower ordinal)
    reader.calls()
    reader.device()
    if not reader.docs:
        raise TraceFormatError(f"{path}: no CUDA or NVTX events (nvprof profile)")
    reader.stats["processes"] = len(reader.docs)
    version = db.scalar("SELECT version FROM Version") if "Version" in db.tables else None
    source = f"nvprof-sqlite {version}" if version is not None else "nvprof-sqlite"
    run_id = clean(opts.run_id) if opts.run_id is not None else f"nvprof|{path.name}"

    def process(pid: int) -> tuple[str, ResourceFacts]:
        return f"process {pid}", ResourceFacts(pid=pid, source_format=source)  # nvprof records no executable

    meta = file_meta(None, _gpu_models(db, reader.strings))
    return convert_processes(reader.docs, meta, replace(opts, run_id=run_id), process, reader.stats, engine)


def _mem_kind(value: object) -> str | None:
    """CUPTI's memory kinds count from 1 (0 = unknown), nsys's from 0."""
    kind = as_int(value)
    return MEM_KIND.get(kind - 1) if kind else None


def _gpu_models(db: Db, strings: dict[int, str]) -> list[str]:
    if "CUPTI_ACTIVITY_KIND_DEVICE" not in db.tables:
        return []
    rows = db.db.execute("SELECT name FROM CUPTI_ACTIVITY_KIND_DEVICE ORDER BY id")
    return [strings[n] for (n,) in rows if isinstance(n, int) and n in strings]


__all__ = ["convert", "demangle", "is_nvprof"]
