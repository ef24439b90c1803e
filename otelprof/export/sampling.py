"""Which traces otelprof sends: ``OTEL_TRACES_SAMPLER`` / ``_ARG``, or a tracer provider's sampler.

One decision per trace id. A step's trace id derives from (run id, step) and is the same on every
rank, and a window's spans of that step share it, so with the specification's samplers (pure
functions of the trace id for a root) every rank and every window agree without talking. The
decision is the OpenTelemetry SDK's own sampler's when the SDK imports; without it,
:func:`decide` computes the same (tests/capture/test_sdk_knobs.py checks the two agree).

otelprof's spans have no sampled parent of the application's to inherit a decision from (a step
nested under an application span records only its ids), so the ``parentbased_*`` samplers decide
as their root sampler does: ``parentbased_traceidratio`` like ``traceidratio``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from ..settings import quoted, text
from ..settings.variables import OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG

_log = logging.getLogger(__name__)

#: The specification's samplers: name -> (root decision kind, takes the ratio).
KNOWN = {
    "always_on": "on",
    "always_off": "off",
    "traceidratio": "ratio",
    "parentbased_always_on": "on",
    "parentbased_always_off": "off",
    "parentbased_traceidratio": "ratio",
}
DEFAULT = "parentbased_always_on"
_LOW64 = (1 << 64) - 1
#: Decisions remembered per process, so a step's window (converted later) meets its step's
#: decision even under a sampler that is not a function of the trace id.
_CACHE = 4096


def decide(kind: str, ratio: float, trace_id: bytes) -> bool:
    """The specification's decision for a root span, as the SDK computes it (TraceIdRatioBased:
    the trace id's low 64 bits under ``round(ratio * 2**64)``)."""
    if kind == "on":
        return True
    if kind == "off":
        return False
    return int.from_bytes(trace_id, "big") & _LOW64 < round(ratio * (_LOW64 + 1))


def _ratio(raw: str | None) -> float:
    """``OTEL_TRACES_SAMPLER_ARG`` for a ratio sampler: unset is 1.0; unusable warns, then 1.0."""
    if raw is None:
        return 1.0
    try:
        value = float(raw)
        if 0.0 <= value <= 1.0:
            return value
    except ValueError:
        pass
    _log.warning("%s=%s is not a ratio from 0 to 1; using 1.0", OTEL_TRACES_SAMPLER_ARG, quoted(raw))
    return 1.0


class TraceSampler:
    """``sampled(trace_id, name)``: the decision for a trace, taken once (cached) and counted in
    ``otelprof_traces_sampled_out_total`` when it drops the trace."""

    def __init__(self, kind: str = "on", ratio: float = 1.0, sdk: Any = None, description: str = DEFAULT) -> None:
        self.kind, self.ratio, self.sdk, self.description = kind, ratio, sdk, description
        self._decided: dict[bytes, bool] = {}
        self._lock = threading.Lock()
        self._counter: Counter | None = None
        self._failed = False
        self.sampled_out = 0

    @property
    def keeps_all(self) -> bool:
        """Every trace is kept without asking: the fast path skips decoding requests."""
        return self.sdk is None and self.kind == "on"

    def register(self, registry: CollectorRegistry) -> None:
        self._counter = Counter(
            "otelprof_traces_sampled_out",
            "Traces (steps, windows) the trace sampler dropped (OTEL_TRACES_SAMPLER).",
            registry=registry,
        )

    def unregister(self, registry: CollectorRegistry) -> None:
        if self._counter is not None:
            registry.unregister(self._counter)
            self._counter = None

    def sampled(self, trace_id: bytes, name: str = "train.step") -> bool:
        if self.keeps_all:
            return True
        with self._lock:
            known = self._decided.get(trace_id)
        if known is not None:
            return known
        keep = self._decide(trace_id, name)
        with self._lock:
            if trace_id in self._decided:  # another thread decided meanwhile: its decision stands
                return self._decided[trace_id]
            if len(self._decided) >= _CACHE:
                self._decided.pop(next(iter(self._decided)))
            self._decided[trace_id] = keep
            if not keep:
                self.sampled_out += 1
        if not keep and self._counter is not None:
            self._counter.inc()
        return keep

    def _decide(self, trace_id: bytes, name: str) -> bool:
        if self.sdk is None:
            return decide(self.kind, self.ratio, trace_id)
        try:
            result = self.sdk.should_sample(None, int.from_bytes(trace_id, "big"), name)
            return bool(result.decision.is_sampled())
        except Exception:  # a user's sampler that fails keeps the trace (logged once)
            if not self._failed:
                self._failed = True
                _log.warning("otelprof: the trace sampler %s failed; keeping traces", self.description, exc_info=True)
            return True


def from_env(environ: Mapping[str, str]) -> TraceSampler:
    """The sampler ``OTEL_TRACES_SAMPLER`` / ``_ARG`` name, the SDK's class when the SDK imports."""
    name = (text(environ, OTEL_TRACES_SAMPLER) or DEFAULT).lower()
    arg = text(environ, OTEL_TRACES_SAMPLER_ARG)
    if name not in KNOWN:
        loaded = _entry_point(name, arg)
        if loaded is not None:
            return TraceSampler(sdk=loaded, description=name)
        _log.warning(
            "%s=%s is no sampler otelprof knows nor an installed opentelemetry_traces_sampler entry point;"
            " sending every trace",
            OTEL_TRACES_SAMPLER,
            quoted(name),
        )
        return TraceSampler(description=DEFAULT)
    kind = KNOWN[name]
    ratio = _ratio(arg) if kind == "ratio" else 1.0
    return TraceSampler(kind, ratio, _sdk_sampler(name, ratio), name)


def from_provider(provider: Any) -> TraceSampler:
    """A tracer provider's own sampler (an SDK ``TracerProvider``'s ``sampler``)."""
    sampler = getattr(provider, "sampler", None)
    if sampler is None or not hasattr(sampler, "should_sample"):
        return TraceSampler()
    description = str(sampler.get_description()) if hasattr(sampler, "get_description") else type(sampler).__name__
    try:
        from opentelemetry.sdk.trace import sampling
    except ImportError:
        return TraceSampler(sdk=sampler, description=description)
    if sampler is sampling.ALWAYS_ON or sampler is sampling.DEFAULT_ON:
        return TraceSampler(description=description)  # keeps every root: the fast path, no decoding
    return TraceSampler(sdk=sampler, description=description)


def _sdk_sampler(name: str, ratio: float) -> Any:
    if KNOWN[name] == "on":
        return None  # every root kept: the fast path, no SDK call per trace (and no SDK import)
    try:
        from opentelemetry.sdk.trace import sampling
    except ImportError:
        return None
    if name == "traceidratio":
        return sampling.TraceIdRatioBased(ratio)
    if name == "parentbased_traceidratio":
        return sampling.ParentBasedTraceIdRatio(ratio)
    return sampling.ALWAYS_OFF if name == "always_off" else sampling.DEFAULT_OFF


def _entry_point(name: str, arg: str | None) -> Any:
    """A sampler from an installed ``opentelemetry_traces_sampler`` entry point (a factory of the
    ARG text, as the SDK's configurator calls it), or None."""
    from importlib.metadata import entry_points

    try:
        found = list(entry_points(group="opentelemetry_traces_sampler", name=name))
        if not found:
            return None
        return found[0].load()(arg or "")
    except Exception:
        _log.warning("%s=%s: its entry point failed to load", OTEL_TRACES_SAMPLER, quoted(name), exc_info=True)
        return None
