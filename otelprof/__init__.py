"""otelprof: PyTorch profiling in the OpenTelemetry stack you already run."""

from typing import TYPE_CHECKING

from ._cli_common import install_last_resort
from ._version import __version__
from .converter import ConvertOptions, ConvertResult, OpStats, TraceFormatError, convert

#: The live-instrumentation API, imported on first use: converting and shipping traces (a host
#: without torch) should not pay for prometheus-client and the capture package at import.
_INSTRUMENTATION = ("instrument", "set_batch_size", "step", "step_scope", "uninstrument")

# otelprof's warnings in a live process read "otelprof: warning: ..." as on the command line
install_last_resort()

if TYPE_CHECKING:
    from .instrumentation import instrument, set_batch_size, step, step_scope, uninstrument


def __getattr__(name: str) -> object:
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
    "uninstrument",
]
