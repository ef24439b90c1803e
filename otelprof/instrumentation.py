"""``instrument()`` / ``uninstrument()`` and the running session: the public face of the live
side. The session lives in ``otelprof.capture.session``; this layer, above both, wires the
framework integrations (``otelprof.integrations``) into it, so neither imports the other's
running state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import integrations
from .capture import session as _session
from .capture.session import Session, session, set_batch_size, step, step_scope, uninstrument
from .capture.windows.handler import trace_handler

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .export.exporter import Exporter


def instrument(
    *,
    environ: Mapping[str, str] | None = None,
    registry: CollectorRegistry | None = None,
    exporter: Exporter | None = None,
    tracer_provider: Any = None,
    meter_provider: Any = None,
) -> Session | None:
    """Starts step tracking, metrics, step spans and profiling windows for this process; returns
    the session, or None when disabled (``OTELPROF_ENABLED=false``, ``OTEL_SDK_DISABLED=true``) or
    when torch is missing. ``tracer_provider``: an OpenTelemetry SDK ``TracerProvider`` whose
    sampler decides and whose span processors get the spans; ``meter_provider``: the
    ``MeterProvider`` the metrics are recorded through (docs/opentelemetry-sdk.md). From now on
    every Hugging Face or Lightning ``Trainer`` built gets otelprof's callback, until the session
    ends."""
    started = _session.instrument(
        environ=environ,
        registry=registry,
        exporter=exporter,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )
    if started is not None and integrations.uninstall not in started.on_close:
        integrations.install(_session.session)
        started.on_close.append(integrations.uninstall)
    return started


__all__ = ["Session", "instrument", "session", "set_batch_size", "step", "step_scope", "trace_handler", "uninstrument"]
