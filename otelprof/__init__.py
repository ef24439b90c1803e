"""otelprof: PyTorch profiling in the OpenTelemetry stack you already run."""

from ._version import __version__
from .converter import ConvertOptions, ConvertResult, OpStats, TraceFormatError, convert

__all__ = ["ConvertOptions", "ConvertResult", "OpStats", "TraceFormatError", "__version__", "convert"]
