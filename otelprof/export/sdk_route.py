"""Where otelprof's spans go: its own OTLP path, the OpenTelemetry SDK's span processors, or both,
after the trace sampler's decision (docs/opentelemetry-sdk.md has the rules).

Every request of step spans and window spans passes through :meth:`TraceRoute.submit`, on the
thread that made it (the step-span thread, the window conversion thread), never the training
thread. When every trace is kept and no SDK processor is fed, the request goes to otelprof's
exporter untouched (no decoding). Otherwise it is decoded once: spans of dropped traces are
removed before the OTLP path, and the kept spans become SDK ``ReadableSpan``s (same ids,
parents, links, events, attributes, resource and times) handed to each processor's ``on_end``.
That route is bounded by what feeds it: the step-span and window queues in front of it drop
(counted) when it falls behind; a processor that raises loses that span, counted in
``otelprof_sdk_route_spans_dropped_total`` and logged once.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry, Counter

from ..settings import quoted, text
from ..settings.variables import OTEL_TRACES_EXPORTER, OTEL_TRACES_SAMPLER
from . import sampling

_log = logging.getLogger(__name__)


def exporter_names(environ: Mapping[str, str]) -> tuple[set[str], bool]:
    """(the span exporters ``OTEL_TRACES_EXPORTER`` names, whether it is set); unset is ``otlp``."""
    raw = text(environ, OTEL_TRACES_EXPORTER)
    names = {n.strip().lower() for n in (raw or "otlp").split(",") if n.strip()}
    return names, raw is not None


def is_otlp(name_or_processor: Any) -> bool:
    """An OTLP exporter's name (``otlp``, ``otlp_proto_grpc``...) or a processor exporting OTLP."""
    if isinstance(name_or_processor, str):
        return name_or_processor.startswith("otlp")
    exporter = getattr(name_or_processor, "span_exporter", None)
    return exporter is not None and type(exporter).__module__.startswith("opentelemetry.exporter.otlp")


class TraceRoute:
    """``submit(request)``: what the exporter's ``submit`` was for otelprof's span producers."""

    def __init__(
        self,
        sampler: sampling.TraceSampler,
        otlp: Callable[[bytes], None] | None,
        processors: Sequence[Any] = (),
        owned: Sequence[Any] = (),
    ) -> None:
        self.sampler = sampler
        self.otlp = otlp  # otelprof's exporter's submit; None: no OTLP traces from otelprof
        self.processors = tuple(processors)  # SDK span processors fed through on_end
        self._owned = tuple(owned)  # of those, the ones otelprof built (shut down by close())
        self._resources: dict[bytes, Any] = {}
        self._dropped: Counter | None = None
        self.spans_dropped = 0

    def register(self, registry: CollectorRegistry) -> None:
        self.sampler.register(registry)
        self._dropped = Counter(
            "otelprof_sdk_route_spans_dropped",
            "Spans an OpenTelemetry SDK span processor refused (raised) on the SDK route.",
            registry=registry,
        )

    def unregister(self, registry: CollectorRegistry) -> None:
        self.sampler.unregister(registry)
        if self._dropped is not None:
            registry.unregister(self._dropped)
            self._dropped = None

    def submit(self, request: bytes) -> None:
        if not self.processors and self.sampler.keeps_all:
            if self.otlp is not None:
                self.otlp(request)
            return
        if self.otlp is None and not self.processors:
            return  # OTEL_TRACES_EXPORTER=none
        message = ExportTraceServiceRequest.FromString(request)
        if _filter(message, self.sampler):
            if not message.resource_spans:
                return
            request = message.SerializeToString()
        if self.otlp is not None:
            self.otlp(request)
        if self.processors:
            self._to_sdk(message)

    def close(self, timeout_s: float = 5.0) -> None:
        """Flushes the providers' processors; shuts down the ones otelprof built."""
        for processor in self.processors:
            try:
                if processor in self._owned:
                    processor.shutdown()
                else:
                    processor.force_flush(int(max(0.0, timeout_s) * 1000))
            except Exception:
                _log.warning("otelprof: flushing an OpenTelemetry SDK span processor failed", exc_info=True)

    def _to_sdk(self, message: ExportTraceServiceRequest) -> None:
        for span in readable_spans(message, self._resources):
            for processor in self.processors:
                try:
                    processor.on_end(span)
                except Exception:
                    self.spans_dropped += 1
                    if self._dropped is not None:
                        self._dropped.inc()
                    if self.spans_dropped == 1:
                        _log.warning("otelprof: an SDK span processor refused a span (counted)", exc_info=True)


def _filter(message: ExportTraceServiceRequest, sampler: sampling.TraceSampler) -> bool:
    """Removes the spans of traces ``sampler`` drops; whether any were removed."""
    if sampler.keeps_all:
        return False
    removed = False
    decided: dict[bytes, bool] = {}  # this request's decisions (no lock per span)

    def keep(span: Any) -> bool:
        known = decided.get(span.trace_id)
        if known is None:
            known = decided[span.trace_id] = sampler.sampled(span.trace_id, span.name)
        return known

    for resource_spans in message.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            kept = [s for s in scope_spans.spans if keep(s)]
            if len(kept) != len(scope_spans.spans):
                removed = True
                del scope_spans.spans[:]
                scope_spans.spans.extend(kept)
        if removed:
            kept_scopes = [s for s in resource_spans.scope_spans if s.spans]
            del resource_spans.scope_spans[:]
            resource_spans.scope_spans.extend(kept_scopes)
    if removed:
        kept_resources = [r for r in message.resource_spans if r.scope_spans]
        del message.resource_spans[:]
        message.resource_spans.extend(kept_resources)
    return removed


def _value(v: Any) -> Any:
    """An OTLP AnyValue as an SDK attribute value (maps and bytes, which SDK attributes cannot
    hold, as text)."""
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if which == "kvlist_value":
        return str({kv.key: _value(kv.value) for kv in v.kvlist_value.values})
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which)


def _attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def readable_spans(message: ExportTraceServiceRequest, resources: dict[bytes, Any] | None = None) -> list[Any]:
    """The request's spans as SDK ``ReadableSpan``s. ``resources`` caches the SDK ``Resource`` by
    its encoding (a session sends one or two)."""
    from opentelemetry import trace as api
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
    from opentelemetry.trace.status import Status, StatusCode

    cache = {} if resources is None else resources
    flags = TraceFlags(TraceFlags.SAMPLED)
    out = []
    for resource_spans in message.resource_spans:
        key = resource_spans.resource.SerializeToString(deterministic=True)
        resource = cache.get(key)
        if resource is None:
            resource = Resource(_attributes(resource_spans.resource.attributes), resource_spans.schema_url or None)
            if len(cache) < 16:
                cache[key] = resource
        for scope_spans in resource_spans.scope_spans:
            scope = InstrumentationScope(
                scope_spans.scope.name, scope_spans.scope.version or None, scope_spans.schema_url or None
            )
            for s in scope_spans.spans:
                trace_id = int.from_bytes(s.trace_id, "big")
                state = TraceState.from_header([s.trace_state]) if s.trace_state else None
                context = SpanContext(trace_id, int.from_bytes(s.span_id, "big"), False, flags, state)
                parent = (
                    SpanContext(trace_id, int.from_bytes(s.parent_span_id, "big"), False, flags)
                    if s.parent_span_id
                    else None
                )
                links = [
                    api.Link(
                        SpanContext(int.from_bytes(k.trace_id, "big"), int.from_bytes(k.span_id, "big"), False, flags),
                        _attributes(k.attributes),
                    )
                    for k in s.links
                ]
                events = [Event(e.name, _attributes(e.attributes), e.time_unix_nano) for e in s.events]
                status = Status(StatusCode(s.status.code), s.status.message or None)
                out.append(
                    ReadableSpan(
                        s.name,
                        context,
                        parent,
                        resource,
                        _attributes(s.attributes),
                        events,
                        links,
                        SpanKind(max(0, s.kind - 1)),
                        status=status,
                        start_time=s.start_time_unix_nano,
                        end_time=s.end_time_unix_nano,
                        instrumentation_scope=scope,
                    )
                )
    return out


def route(environ: Mapping[str, str], otlp: Callable[[bytes], None], tracer_provider: Any = None) -> TraceRoute:
    """The route the settings and providers ask for (docs/opentelemetry-sdk.md):

    - ``OTEL_TRACES_EXPORTER=none``: no spans at all.
    - ``tracer_provider`` given: its sampler decides, all its processors get the spans; otelprof's
      OTLP path only if ``OTEL_TRACES_EXPORTER`` is set, names ``otlp`` and the provider exports
      no OTLP itself.
    - else, the global provider an SDK ``TracerProvider`` (``opentelemetry-instrument``, an
      application's own): its sampler decides, its processors that do not export OTLP get the
      spans (otelprof's OTLP path stands for the others), OTLP as ``OTEL_TRACES_EXPORTER`` says.
    - else ``OTEL_TRACES_SAMPLER`` decides, ``otlp`` is otelprof's path and each other name of
      ``OTEL_TRACES_EXPORTER`` an SDK exporter (entry point ``opentelemetry_traces_exporter``)
      in a ``BatchSpanProcessor`` otelprof owns.
    """
    names, explicit = exporter_names(environ)
    if names <= {"none"}:
        return TraceRoute(sampling.TraceSampler(), None)
    names.discard("none")
    wants_otlp = any(is_otlp(n) for n in names)
    provider = tracer_provider if tracer_provider is not None else _global_sdk_provider()
    if provider is not None:
        processors = _processors(provider)
        if processors is None:  # private attributes moved: otelprof's OTLP path instead
            return TraceRoute(sampling.from_provider(provider), otlp if wants_otlp else None)
        if tracer_provider is not None:
            send_otlp = explicit and wants_otlp and not any(is_otlp(p) for p in processors)
        else:
            processors = [p for p in processors if not is_otlp(p)]
            send_otlp = wants_otlp
        return TraceRoute(sampling.from_provider(provider), otlp if send_otlp else None, processors)
    owned = _built_processors(sorted(n for n in names if not is_otlp(n)))
    return TraceRoute(sampling.from_env(environ), otlp if wants_otlp else None, owned, owned)


def _global_sdk_provider() -> Any:
    """The global tracer provider when it is the SDK's (not the API's proxy or no-op), else None.
    Imports nothing: an SDK provider exists only where the application imported the SDK (and
    the route is chosen at the first step, maybe inside the user's with_stack profile, where an
    import would leave torch's Python tracer a freed code object: capture/coexist.py)."""
    api, sdk = sys.modules.get("opentelemetry.trace"), sys.modules.get("opentelemetry.sdk.trace")
    if api is None or sdk is None:
        return None
    provider = api.get_tracer_provider()
    return provider if isinstance(provider, sdk.TracerProvider) else None


def preload(environ: Mapping[str, str]) -> None:
    """At ``instrument()``, before any profile: the SDK modules the route will use when the
    environment asks for a sampler or SDK exporters (the default route imports none)."""
    # the raw texts: the route reads (and warns about) them once, at the first step
    names = {n.strip() for n in environ.get(OTEL_TRACES_EXPORTER, "otlp").lower().split(",") if n.strip()}
    sampler = environ.get(OTEL_TRACES_SAMPLER, "").strip().lower() or sampling.DEFAULT
    if all(is_otlp(n) or n == "none" for n in names) and sampling.KNOWN.get(sampler) == "on":
        return
    for module in ("opentelemetry.sdk.trace.sampling", "opentelemetry.sdk.trace.export", "opentelemetry.trace.status"):
        try:
            importlib.import_module(module)
        except ImportError:
            return  # said when the route is chosen


_warned_private = False


def _processors(provider: Any) -> list[Any] | None:
    """The span processors of an SDK ``TracerProvider``. The SDK has no public accessor: read
    through ``_active_span_processor._span_processors``, guarded (None and one warning when
    those private attributes are not there)."""
    global _warned_private
    multi = getattr(provider, "_active_span_processor", None)
    found = getattr(multi, "_span_processors", None)
    if isinstance(found, tuple | list):
        return list(found)
    if hasattr(provider, "add_span_processor") and not _warned_private:
        _warned_private = True
        _log.warning(
            "otelprof: cannot read this TracerProvider's span processors (the SDK's private"
            " _active_span_processor changed); spans go by otelprof's OTLP path only"
        )
    return None


def _built_processors(names: Sequence[str]) -> list[Any]:
    """A ``BatchSpanProcessor`` per SDK exporter named (unknown names warn and are skipped)."""
    if not names:
        return []
    try:
        from importlib.metadata import entry_points

        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        _log.warning(
            "%s=%s needs the OpenTelemetry SDK (pip install opentelemetry-sdk); those exporters get no spans",
            OTEL_TRACES_EXPORTER,
            quoted(",".join(names)),
        )
        return []
    out = []
    for name in names:
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            _log.warning("%s: no installed span exporter is named %s; skipped", OTEL_TRACES_EXPORTER, quoted(name))
            continue
        try:
            out.append(BatchSpanProcessor(found[0].load()()))
        except Exception:
            _log.warning("%s: the span exporter %s failed to start", OTEL_TRACES_EXPORTER, quoted(name), exc_info=True)
    return out
