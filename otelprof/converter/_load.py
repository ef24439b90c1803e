"""Trace input: a path (plain or gzip JSON) or bytes -> the raw JSON bytes."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from .._native_module import native
from ._errors import TraceFormatError

# the C++ inflater (native/src/gzip.cpp); absent when _native or zlib's headers were not there
_native = native if native is not None and hasattr(native, "gunzip") else None

TraceInput = str | os.PathLike[str] | bytes | bytearray | memoryview
#: Raw JSON as ``load_bytes`` returns it: inflated gzip stays the bytearray it was inflated into.
TraceBytes = bytes | bytearray

#: Refuse to inflate past this, over all gzip members together (a gzip bomb must not exhaust
#: memory); inflation stops at the first byte past it.
MAX_TRACE_BYTES = 4 * 1024**3
#: Compressed input fed to zlib per call, and the most it inflates per call.
_IN_CHUNK = 1024 * 1024
_OUT_CHUNK = 16 * 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"


def gunzip(data: bytes | bytearray | memoryview, source: str, limit: int | None = None) -> bytearray:
    """``data`` inflated by the native core (GIL released) where it is built, else by
    ``py_gunzip``: the same bytes and the same errors either way."""
    if _native is None:
        return py_gunzip(data, source, limit)
    cap = MAX_TRACE_BYTES if limit is None else limit
    try:
        out: bytearray = _native.gunzip(data, cap)
    except _native.TraceError as exc:
        raise TraceFormatError(f"{source}: {exc}") from None
    return out


def py_gunzip(data: bytes | bytearray | memoryview, source: str, limit: int | None = None) -> bytearray:
    """Every member of a gzip stream (concatenated members are one file, as gzip(1) reads
    them) inflated into one buffer, one member after another in a loop. Raises
    TraceFormatError for corrupt or truncated data and as soon as more than ``limit``
    (default ``MAX_TRACE_BYTES``) bytes come out."""
    cap = MAX_TRACE_BYTES if limit is None else limit
    view = memoryview(data).cast("B")
    out = bytearray()
    at = 0  # start of the current member in `view`
    try:
        while True:
            decomp = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            fed = at  # input is fed in pieces: unconsumed_tail then copies a piece, not the rest
            pending: bytes | memoryview = b""
            while not decomp.eof:
                if not pending:
                    if fed >= len(view):
                        raise TraceFormatError(f"{source}: truncated gzip data")
                    pending = view[fed : fed + _IN_CHUNK]
                    fed += len(pending)
                # never more than one byte past the cap: a bomb stops there
                out += decomp.decompress(pending, min(_OUT_CHUNK, cap + 1 - len(out)))
                if len(out) > cap:
                    raise TraceFormatError(f"{source}: decompressed trace exceeds {cap} bytes")
                pending = decomp.unconsumed_tail
            at = fed - len(decomp.unused_data)
            if view[at : at + 2] != _GZIP_MAGIC:  # trailing bytes that are not a member are ignored
                return out
    except zlib.error as exc:
        raise TraceFormatError(f"{source}: corrupt gzip data ({exc})") from None


def read_input(trace: TraceInput) -> tuple[bytes, str]:
    """The bytes of a trace as stored (gzip or not) and a name for messages."""
    if isinstance(trace, (bytes, bytearray, memoryview)):
        return bytes(trace), "<bytes>"
    path = Path(os.fspath(trace))
    try:
        return path.read_bytes(), str(path)
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read trace ({exc.strerror or exc})") from None


def is_gzip(data: TraceBytes) -> bool:
    return data[:2] == _GZIP_MAGIC


def load_bytes(trace: TraceInput) -> tuple[TraceBytes, str]:
    """Raw JSON bytes of a trace and a name for messages."""
    raw, source = read_input(trace)
    return as_json(raw, source), source


def as_json(raw: bytes, source: str) -> TraceBytes:
    """The JSON of a trace as stored: gzip inflated; empty or blank text refused."""
    data: TraceBytes = raw
    if is_gzip(data):
        data = gunzip(data, source)  # kept as inflated: a bytes() copy would double the memory
    if not data or data.isspace():  # (strip() would copy the whole trace to decide this)
        raise TraceFormatError(f"{source}: empty trace")
    return data


__all__ = [
    "MAX_TRACE_BYTES",
    "TraceBytes",
    "TraceInput",
    "as_json",
    "gunzip",
    "is_gzip",
    "load_bytes",
    "py_gunzip",
    "read_input",
]
