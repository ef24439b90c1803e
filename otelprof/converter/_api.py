"""``convert()``: the native core when it loads, the Python reference otherwise."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._native_module import native as _native
from .._native_module import native_error as _native_error
from . import _load
from ._errors import TraceFormatError
from ._load import TraceBytes, TraceInput, as_json, is_gzip, read_input
from ._options import ConvertOptions

if TYPE_CHECKING:
    from .reference import OpRow

_log = logging.getLogger(__name__)
_warned = False


@dataclass(frozen=True)
class OpStats:
    """One ``key_averages()`` row: times in nanoseconds."""

    name: str
    kind: str  # "op", "annotation" or "device"
    input_shapes: str
    calls: int
    cpu_total_ns: int
    self_cpu_ns: int
    device_total_ns: int
    self_device_ns: int


@dataclass(frozen=True)
class ConvertResult:
    """OTLP ``ExportTraceServiceRequest`` messages (each under the size limit), per-op
    aggregates, and counters that reconcile kept and dropped events with the input.
    ``window_id`` names the trace by its content (16 hex digits): it is mixed into the span
    ids, so several windows or files of one run and rank never share an id."""

    requests: list[bytes]
    ops: list[OpStats]
    stats: dict[str, int]
    engine: str
    window_id: str = ""


def native_available() -> bool:
    return _native is not None


def _fallback_warning() -> None:
    global _warned
    if not _warned:
        _warned = True
        _log.warning("otelprof._native could not be loaded (%s); using the slower Python converter", _native_error)


def _op_stats(r: _native.OpRow | OpRow) -> OpStats:
    """An op row of either engine (same field names) as the public ``OpStats``."""
    return OpStats(
        r.name, r.kind, r.input_shapes, r.calls, r.cpu_total_ns, r.self_cpu_ns, r.device_total_ns, r.self_device_ns
    )


def _native_result(out: _native.ConvertOutput) -> ConvertResult:
    ops = [_op_stats(r) for r in out.ops]
    return ConvertResult(list(out.requests), ops, dict(out.stats), "native", out.window_id)


def _check_engine(engine: str) -> None:
    if engine not in ("auto", "native", "reference"):
        raise ValueError(f"engine must be 'auto', 'native' or 'reference', not {engine!r}")
    if engine == "native" and _native is None:
        raise RuntimeError(f"otelprof._native is not available: {_native_error}")


def convert_bytes(data: TraceBytes, options: ConvertOptions, engine: str = "auto") -> ConvertResult:
    """Convert raw Kineto JSON bytes. ``engine``: "auto", "native" or "reference"."""
    _check_engine(engine)
    if engine != "reference" and _native is not None:
        try:
            out = _native.convert(data, options.as_native())
        except _native.TraceError as exc:
            raise TraceFormatError(str(exc)) from None
        return _native_result(out)
    if engine == "auto":
        _fallback_warning()
    from . import reference

    requests, ref_rows, stats, window = reference.convert(data, options)
    ops = [_op_stats(r) for r in ref_rows]
    return ConvertResult(requests, ops, stats, "reference", window)


def convert(
    trace: TraceInput, *, options: ConvertOptions | None = None, engine: str = "auto", **fields: Any
) -> ConvertResult:
    """Convert a Kineto trace (path to ``.json``/``.json.gz``, or bytes) into OTLP requests.

    Pass a :class:`ConvertOptions` or its fields as keywords. Raises
    :class:`TraceFormatError` (a ``ValueError``) with a one-line reason for bad input.
    """
    if options is not None and fields:
        raise TypeError("pass either options= or option keywords, not both")
    opts = options or ConvertOptions(**fields)
    _check_engine(engine)
    raw, source = read_input(trace)
    if engine != "reference" and is_gzip(raw) and hasattr(_native, "convert_gzip"):
        # inflated on a second native thread while this one parses; same errors as load_bytes
        try:
            out = _native.convert_gzip(raw, opts.as_native(), _load.MAX_TRACE_BYTES)
        except _native.GzipError as exc:
            raise TraceFormatError(f"{source}: {exc}") from None
        except _native.TraceError as exc:
            raise TraceFormatError(str(exc)) from None
        return _native_result(out)
    return convert_bytes(as_json(raw, source), opts, engine)
