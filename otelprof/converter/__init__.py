"""Kineto profiler traces -> OpenTelemetry spans (OTLP ``ExportTraceServiceRequest`` bytes)."""

from ._api import ConvertResult, OpStats, convert, convert_bytes, native_available
from ._errors import TraceFormatError
from ._load import load_bytes
from ._options import ConvertOptions, LiveStep

__all__ = [
    "ConvertOptions",
    "ConvertResult",
    "LiveStep",
    "OpStats",
    "TraceFormatError",
    "convert",
    "convert_bytes",
    "load_bytes",
    "native_available",
]
