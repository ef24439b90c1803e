"""otelprof: PyTorch profiling in the OpenTelemetry stack you already run."""

from ._logformat import install_last_resort
from ._version import __version__

#: The converter's API, imported on first use: ``otelprof run`` (which starts every training
#: job) and the bootstrap of each process it starts must not pay ~0.1 s for it.
_CONVERTER = ("ConvertOptions", "ConvertResult", "OpStats", "TraceFormatError", "convert")
#: The live-instrumentation API, imported on first use: converting and shipping traces (a host
#: without torch) should not pay for prometheus-client and the capture package at import.
_INSTRUMENTATION = ("instrument", "set_batch_size", "step", "step_scope", "trace_handler", "uninstrument")
TYPE_CHECKING = False  # typing's, without importing typing at ``import otelprof``

# otelprof's warnings in a live process read "otelprof: warning: ..." as on the command line
install_last_resort()

if TYPE_CHECKING:
    from .converter import ConvertOptions, ConvertResult, OpStats, TraceFormatError, convert
    from .instrumentation import instrument, set_batch_size, step, step_scope, trace_handler, uninstrument


def __getattr__(name: str) -> object:
    if name in _CONVERTER:
        from . import converter

        return getattr(converter, name)
    if name in _INSTRUMENTATION:
        from . import instrumentation

        return getattr(instrumentation, name)
    raise AttributeError(f"module 'otelprof' has no attribute {name!r}")


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
    "trace_handler",
    "uninstrument",
]
