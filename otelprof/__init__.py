"""otelprof: PyTorch profiling in the OpenTelemetry stack you already run."""

from ._version import __version__
from .converter import ConvertOptions, ConvertResult, OpStats, TraceFormatError, convert
from .instrumentation import instrument, set_batch_size, step, step_scope, uninstrument

__all__ = [
    "ConvertOptions",
    "ConvertResult",
    "OpStats",
    "TraceFormatError",
    "__version__",
    "convert",
    "instrument",
    "set_batch_size",
    "step",
    "step_scope",
    "uninstrument",
]
