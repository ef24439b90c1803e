"""The OpenTelemetry instrumentor, for ``opentelemetry-instrument python train.py``.

Registered under the ``opentelemetry_instrumentor`` entry point (pyproject.toml). Needs the
``opentelemetry-instrumentation`` package (the ``torch`` extra installs it).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from .instrumentation import instrument, uninstrument

if TYPE_CHECKING:
    # opentelemetry's instrumentor module opts out of type checking (a file-level
    # ``# type: ignore``), so mypy sees no BaseInstrumentor there: this is the part of it that
    # otelprof and its callers use.
    class BaseInstrumentor:
        def instrument(self, **kwargs: Any) -> Any: ...
        def uninstrument(self, **kwargs: Any) -> Any: ...
        @abstractmethod
        def instrumentation_dependencies(self) -> Collection[str]: ...
        def _instrument(self, **kwargs: Any) -> Any: ...
        @abstractmethod
        def _uninstrument(self, **kwargs: Any) -> Any: ...

else:
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor


class TorchInstrumentor(BaseInstrumentor):
    """Idempotent (BaseInstrumentor refuses a second ``instrument()``) and fully undoable."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("torch >= 2.2",)

    def _instrument(self, **kwargs: Any) -> None:
        """``tracer_provider`` / ``meter_provider``, as every contrib instrumentor takes them: the
        provider's sampler and span processors, the metrics' MeterProvider (docs/opentelemetry-sdk.md)."""
        instrument(
            registry=kwargs.get("registry"),
            exporter=kwargs.get("exporter"),
            tracer_provider=kwargs.get("tracer_provider"),
            meter_provider=kwargs.get("meter_provider"),
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstrument()
