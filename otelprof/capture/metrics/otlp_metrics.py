"""The live metrics over OTLP too, through the OpenTelemetry SDK's MeterProvider, when
``OTEL_METRICS_EXPORTER`` names ``otlp``.

Step and phase durations are SDK histograms recorded at each step, with the step span as the
current context so the SDK's trace-based exemplar filter attaches the step's trace id. Every
other series is read from the prometheus-client registry at export time by observable
instruments (histograms, which the API cannot observe, are added to each export), so the two
paths cannot disagree. OTel names are the Prometheus names with dots and a unit
(``otelprof_window_gpu_busy_ratio`` -> ``otelprof.window.gpu.busy``, unit ``1``; counts carry an
annotation such as ``{request}``), so a Collector's Prometheus exporter turns them back into the
names the dashboards use (tests/stack/test_metric_paths.py applies its rules).

The SDK's OTLP exporter reads its own ``OTEL_EXPORTER_OTLP_METRICS_*`` / ``OTEL_EXPORTER_OTLP_*``
settings and ``OTEL_METRIC_EXPORT_INTERVAL`` from the process environment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from ...settings import text, value
from ...settings.variables import (
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_METRICS_EXPORTER,
)
from ..steps.step import PHASES, Step
from .step_metrics import STEP_BUCKETS

_log = logging.getLogger(__name__)

#: Recorded at each step (not bridged): (name, unit).
DIRECT = (
    ("otelprof.step.duration", "s"),
    ("otelprof.step.phase.duration", "s"),
    ("otelprof.steps", "{step}"),
    ("otelprof.samples", "{sample}"),
    ("otelprof.tokens", "{token}"),
    ("otelprof.micro_batches", "{batch}"),
)
#: Prometheus families bridged as observable instruments: (name, counter?, unit). Counts carry
#: an annotation, not "1": a Collector's Prometheus exporter appends _ratio to a gauge of unit
#: "1" and drops annotations, so each family comes back under its own name
#: (tests/stack/test_metric_paths.py). The per-second gauges are left out: over OTLP, rates
#: come from the counters.
BRIDGED = (
    ("otelprof_last_step_timestamp_seconds", False, "s"),
    ("otelprof_process_cpu_seconds", True, "s"),
    ("otelprof_process_max_rss_bytes", False, "By"),
    ("otelprof_gpu_memory_allocated_bytes", False, "By"),
    ("otelprof_gpu_memory_reserved_bytes", False, "By"),
    ("otelprof_gpu_memory_peak_bytes", False, "By"),
    ("otelprof_gpu_memory_total_bytes", False, "By"),
    ("otelprof_step_memory_peak_bytes", False, "By"),
    ("otelprof_oom", True, "{error}"),
    ("otelprof_step_spans_dropped", True, "{span}"),
    ("otelprof_eval_forwards", True, "{forward}"),
    ("otelprof_skipped_updates", True, "{update}"),
    ("otelprof_profiling_windows", True, "{window}"),
    ("otelprof_profiling_windows_failed", True, "{window}"),
    ("otelprof_windows_skipped", True, "{window}"),
    ("otelprof_window_traces_not_kept", True, "{window}"),
    ("otelprof_profiling_window_overhead_seconds", True, "s"),
    ("otelprof_profiling_window_last_timestamp_seconds", False, "s"),
    ("otelprof_window_op_self_cpu_seconds", False, "s"),
    ("otelprof_window_op_self_device_seconds", False, "s"),
    ("otelprof_window_kernel_device_seconds", False, "s"),
    ("otelprof_window_gpu_busy_ratio", False, "1"),
    ("otelprof_window_memory_peak_bytes", False, "By"),
    ("otelprof_window_memory_total_peak_bytes", False, "By"),
    ("otelprof_window_memory_timeline_failed", True, "{window}"),
    ("otelprof_step_flops", False, "{flop}"),
    ("otelprof_achieved_flops_per_second", False, "{flop}/s"),
    ("otelprof_mfu_ratio", False, "1"),
    ("otelprof_straggler_ratio", False, "1"),
    ("otelprof_profile_triggers", True, "{request}"),
    ("otelprof_export_requests", True, "{request}"),
    ("otelprof_export_dropped_requests", True, "{request}"),
    ("otelprof_export_worker_errors", True, "{error}"),
    ("otelprof_export_retries", True, "{attempt}"),
    ("otelprof_export_spans_rejected", True, "{span}"),
    ("otelprof_export_spool_evicted_requests", True, "{request}"),
    ("otelprof_export_queue_requests", False, "{request}"),
    ("otelprof_export_spool_bytes", False, "By"),
    ("otelprof_traces_sampled_out", True, "{trace}"),
    ("otelprof_sdk_route_spans_dropped", True, "{span}"),
)
#: Prometheus histograms bridged whole at export time (the OTel API has no observable
#: histogram): their buckets, sum and count as the registry holds them.
BRIDGED_HISTOGRAMS = (("otelprof_export_duration_seconds", "s"),)
#: The Prometheus unit suffix a unit stands for (the name keeps suffixes of annotated units).
_SUFFIXES = {"s": "_seconds", "By": "_bytes", "1": "_ratio", "{flop}/s": "_per_second"}
_UNITS = {family: unit for family, _, unit in BRIDGED} | dict(BRIDGED_HISTOGRAMS)
_HISTOGRAMS = frozenset(family for family, _ in BRIDGED_HISTOGRAMS)


def otel_name(prometheus_name: str) -> tuple[str, str]:
    """(OTel instrument name, UCUM unit) of a bridged Prometheus family."""
    unit = _UNITS[prometheus_name]
    suffix = _SUFFIXES.get(unit, "")
    stem = prometheus_name.removesuffix(suffix)
    return stem.replace("_", "."), unit


def exporters(environ: Mapping[str, str]) -> set[str]:
    """The metric exporters ``OTEL_METRICS_EXPORTER`` names (unset: ``prometheus``)."""
    return set(value(environ, OTEL_METRICS_EXPORTER, _log)) - {"none"}


class OtlpMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        labels: Mapping[str, str],
        resource: Mapping[str, Any],
        environ: Mapping[str, str],
        meter_provider: Any = None,
        sampled: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``meter_provider``: the caller's (``instrument(meter_provider=...)``), used instead of
        one built here and never shut down by otelprof (its readers see only the instruments;
        the bridged histograms ride on the exporter built here). ``sampled``: the trace
        sampler's decision; an exemplar of a trace not sent is left out."""
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        from ..._version import __version__

        self._labels = dict(labels)
        self._phase_labels = {phase: {**labels, "phase": phase} for phase in PHASES}
        self._registry = registry
        self._lock = threading.Lock()
        self._samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        self._histogram_families: list[Any] = []
        self._read_at = float("-inf")
        self._sampled = sampled
        self._owned = meter_provider is None
        if meter_provider is not None:
            self.provider = meter_provider
        else:
            reader = PeriodicExportingMetricReader(_with_histograms(_exporter(environ), self._histograms))
            # no exit handler of the SDK's: registered after otelprof's, it would run first and
            # export before the session closes the last step (Session.close shuts this down)
            self.provider = MeterProvider(
                resource=Resource.create(dict(resource)), metric_readers=[reader], shutdown_on_exit=False
            )
        meter = self.provider.get_meter("otelprof", __version__)
        units = dict(DIRECT)
        # the scrape path's buckets (the SDK's default ones start at 5 s)
        self._duration = meter.create_histogram(
            "otelprof.step.duration", "s", "Training step wall time.", explicit_bucket_boundaries_advisory=STEP_BUCKETS
        )
        self._phase = meter.create_histogram(
            "otelprof.step.phase.duration",
            "s",
            "Time per step in each phase.",
            explicit_bucket_boundaries_advisory=STEP_BUCKETS,
        )
        self._steps = meter.create_counter("otelprof.steps", units["otelprof.steps"], "Training steps completed.")
        self._samples_total = meter.create_counter("otelprof.samples", units["otelprof.samples"], "Samples processed.")
        self._tokens_total = meter.create_counter("otelprof.tokens", units["otelprof.tokens"], "Tokens processed.")
        self._micro_batches = meter.create_counter(
            "otelprof.micro_batches",
            units["otelprof.micro_batches"],
            "DataLoader batches (micro-batches) of the steps completed.",
        )
        for family, counter, _ in BRIDGED:
            name, unit = otel_name(family)
            make = meter.create_observable_counter if counter else meter.create_observable_gauge
            make(name, [self._callback(family)], unit)

    def observe(self, step: Step, trace_id: bytes, span_id: bytes) -> None:
        """At each step of the Python route (training thread)."""
        phases = [(phase, ns / 1e9) for phase, ns in step.phase_totals_ns.items()]
        self.record(step.duration_s, phases, step.samples, step.tokens, step.micro_batches, trace_id, span_id)

    def observe_folded(self, folded: Any, trace_id: bytes, span_id: bytes) -> None:
        """At each step the native sink folded (``_native.FoldedStep``; training thread)."""
        self.record(
            folded.seconds, folded.phases, folded.samples, folded.tokens, folded.micro_batches, trace_id, span_id
        )

    def record(
        self,
        seconds: float,
        phases: Iterable[tuple[str, float]],
        samples: int | None,
        tokens: int | None,
        micro_batches: int,
        trace_id: bytes,
        span_id: bytes,
    ) -> None:
        """A few microseconds of SDK bookkeeping; the step span is the current context, so the
        SDK's trace-based exemplar filter attaches its trace id."""
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        span = NonRecordingSpan(
            SpanContext(
                int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"), False, TraceFlags(TraceFlags.SAMPLED)
            )
        )
        labels = self._labels
        sampled = self._sampled
        context = trace.set_span_in_context(span) if sampled is None or sampled(trace_id) else None
        self._duration.record(seconds, labels, context)
        self._steps.add(1, labels)
        for phase, phase_seconds in phases:
            self._phase.record(phase_seconds, self._phase_labels.get(phase) or {**labels, "phase": phase})
        if samples is not None:
            self._samples_total.add(samples, labels)
        if tokens is not None:
            self._tokens_total.add(tokens, labels)
        if micro_batches:
            self._micro_batches.add(micro_batches, labels)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Exports what is left, after the session's last step: the registry is read afresh."""
        with self._lock:
            self._read_at = float("-inf")
        try:
            if not self._owned:  # the caller's provider: flushed, left running
                self.provider.force_flush(timeout_millis=max(0.0, timeout_s) * 1000)
                return
            self.provider.shutdown(timeout_millis=max(0.0, timeout_s) * 1000)
        except Exception:
            _log.warning("otelprof: shutting the OTLP metrics down failed", exc_info=True)

    def _callback(self, family: str) -> Any:
        from opentelemetry.metrics import Observation

        def observe(_options: Any) -> Iterable[Observation]:
            return [Observation(value, labels) for labels, value in self._read(family)]

        return observe

    def _histograms(self) -> list[Any]:
        """The bridged histograms as SDK metrics, from the registry read of this export."""
        from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram, Metric

        now = time.time_ns()
        out = []
        for metric in self._snapshot()[1]:
            points = _histogram_points(metric, now)
            if points:
                data = Histogram(points, AggregationTemporality.CUMULATIVE)
                name, unit = otel_name(metric.name)
                out.append(Metric(name, metric.documentation, unit, data))
        return out

    def _read(self, family: str) -> list[tuple[dict[str, str], float]]:
        """The registry's samples of ``family``."""
        return self._snapshot()[0].get(family, [])

    def _snapshot(self) -> tuple[dict[str, list[tuple[dict[str, str], float]]], list[Any]]:
        """(samples by family, bridged histogram families), collected once per export (the
        callbacks, then the histograms, run in a row): one registry read, one snapshot."""
        with self._lock:
            if time.monotonic() - self._read_at > 1.0:
                samples: dict[str, list[tuple[dict[str, str], float]]] = {}
                histograms = []
                for metric in self._registry.collect():
                    if metric.type == "histogram" and metric.name in _HISTOGRAMS:
                        histograms.append(metric)
                    for s in metric.samples:
                        if s.name in (metric.name, metric.name + "_total"):
                            samples.setdefault(metric.name, []).append((dict(s.labels), float(s.value)))
                self._samples, self._histogram_families = samples, histograms
                self._read_at = time.monotonic()
            return self._samples, self._histogram_families


def _histogram_points(metric: Any, now_ns: int) -> list[Any]:
    """A prometheus-client histogram family as cumulative OTLP points (min and max unknown)."""
    from opentelemetry.sdk.metrics.export import HistogramDataPoint

    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in metric.samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        point = series.setdefault(tuple(sorted(labels.items())), {"buckets": [], "start": now_ns})
        if s.name.endswith("_bucket"):
            point["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_sum"):
            point["sum"] = s.value
        elif s.name.endswith("_count"):
            point["count"] = int(s.value)
        elif s.name.endswith("_created"):
            point["start"] = int(s.value * 1e9)
    points = []
    for key, point in series.items():
        buckets = sorted(point["buckets"])
        cumulative = [int(v) for _, v in buckets]
        counts = [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)]
        bounds = [le for le, _ in buckets if le != float("inf")]
        points.append(
            HistogramDataPoint(
                attributes=dict(key),
                start_time_unix_nano=point["start"],
                time_unix_nano=now_ns,
                count=point["count"],
                sum=point["sum"],
                bucket_counts=counts,
                explicit_bounds=bounds,
                min=None,  # type: ignore[arg-type]  # unknown to Prometheus: left unset in OTLP
                max=None,  # type: ignore[arg-type]
            )
        )
    return points


def _exporter(environ: Mapping[str, str]) -> Any:
    protocol = (
        text(environ, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL)
        or text(environ, OTEL_EXPORTER_OTLP_PROTOCOL)
        or "http/protobuf"
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    return HttpExporter()


def _with_histograms(inner: Any, histograms: Callable[[], list[Any]]) -> Any:
    """The OTLP exporter, adding the bridged Prometheus histograms to each export (this SDK
    has no metric producers). A class made here: the SDK is imported only when used."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricsData, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from ..._version import __version__

    scope = InstrumentationScope("otelprof", __version__)

    class WithHistograms(MetricExporter):
        def __init__(self) -> None:
            super().__init__(inner._preferred_temporality, inner._preferred_aggregation)

        def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            extra = histograms()
            if extra and metrics_data.resource_metrics:
                first, *rest = metrics_data.resource_metrics
                # into the meter's own scope (the OTLP encoder keeps one ScopeMetrics per scope)
                scopes = [
                    ScopeMetrics(sm.scope, [*sm.metrics, *extra], sm.schema_url) if sm.scope == scope else sm
                    for sm in first.scope_metrics
                ]
                if not any(sm.scope == scope for sm in first.scope_metrics):
                    scopes.append(ScopeMetrics(scope, extra, ""))
                metrics_data = MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])
            return inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return bool(inner.force_flush(timeout_millis=timeout_millis))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    return WithHistograms()
