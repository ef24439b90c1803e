"""Trace input: a path (plain or gzip JSON) or bytes -> the raw JSON bytes."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from ._errors import TraceFormatError

TraceInput = str | os.PathLike[str] | bytes | bytearray | memoryview

#: Refuse to inflate gzip members past this (a zip bomb must not exhaust memory).
MAX_TRACE_BYTES = 4 * 1024**3


def _gunzip(data: bytes, source: str) -> bytes:
    out = bytearray()
    decomp = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        view = memoryview(data)
        while True:
            out += decomp.decompress(view, 64 * 1024 * 1024)
            if len(out) > MAX_TRACE_BYTES:
                raise TraceFormatError(f"{source}: decompressed trace exceeds {MAX_TRACE_BYTES} bytes")
            view = memoryview(decomp.unconsumed_tail)
            if decomp.eof:
                if decomp.unused_data.startswith(b"\x1f\x8b"):  # concatenated gzip members
                    return bytes(out) + _gunzip(decomp.unused_data, source)
                return bytes(out)
            if not view:
                raise TraceFormatError(f"{source}: truncated gzip data")
    except zlib.error as exc:
        raise TraceFormatError(f"{source}: corrupt gzip data ({exc})") from None


def load_bytes(trace: TraceInput) -> tuple[bytes, str]:
    """Raw JSON bytes of a trace and a name for messages."""
    if isinstance(trace, (bytes, bytearray, memoryview)):
        data, source = bytes(trace), "<bytes>"
    else:
        path = Path(os.fspath(trace))
        source = str(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise TraceFormatError(f"{source}: cannot read trace ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data, source)
    if not data or data.isspace():  # (strip() would copy the whole trace to decide this)
        raise TraceFormatError(f"{source}: empty trace")
    return data, source


__all__ = ["TraceInput", "load_bytes"]
