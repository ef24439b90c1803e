"""The OpenTelemetry instrumentor, for ``opentelemetry-instrument python train.py``.

Registered under the ``opentelemetry_instrumentor`` entry point (pyproject.toml). Needs the
``opentelemetry-instrumentation`` package (the ``torch`` extra installs it).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from .instrumentation import instrument, uninstrument


class TorchInstrumentor(BaseInstrumentor):
    """Idempotent (BaseInstrumentor refuses a second ``instrument()``) and fully undoable."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("torch >= 2.2",)

    def _instrument(self, **kwargs: Any) -> None:
        instrument(registry=kwargs.get("registry"), exporter=kwargs.get("exporter"))

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstrument()
