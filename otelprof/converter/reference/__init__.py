"""Pure-Python reference converter: the test oracle, and the fallback without ``_native``."""

from __future__ import annotations

from ...otlp.encoder import encode
from .._options import ConvertOptions
from .builder import Built, OpRow, build
from .reader import read

__all__ = ["OpRow", "convert"]


def convert(data: bytes | bytearray, opts: ConvertOptions) -> tuple[list[bytes], list[OpRow], dict[str, int], str]:
    """(requests, op rows, stats, window id) of a trace."""
    built: Built = build(read(data, opts.base_time_ns), opts)
    requests = encode(built.spans, built.resource, opts.scope_version, opts.max_request_bytes)
    built.stats["requests"] = len(requests)
    return requests, built.ops, built.stats, built.window_id
