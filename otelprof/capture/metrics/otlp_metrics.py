"""The live metrics over OTLP too, through the OpenTelemetry SDK's MeterProvider, when
``OTEL_METRICS_EXPORTER`` names ``otlp``.

Step and phase durations are SDK histograms recorded at each step, with the step span as the
current context so the SDK's trace-based exemplar filter attaches the step's trace id. Every
other series is read from the prometheus-client registry at export time by observable
instruments, so the two paths cannot disagree. OTel names are the Prometheus names with dots
and a unit (``otelprof_window_gpu_busy_ratio`` -> ``otelprof.window.gpu.busy``, unit ``1``),
so a Collector's Prometheus exporter turns them back into the names the dashboards use.

The SDK's OTLP exporter reads its own ``OTEL_EXPORTER_OTLP_METRICS_*`` / ``OTEL_EXPORTER_OTLP_*``
settings and ``OTEL_METRIC_EXPORT_INTERVAL`` from the process environment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from ...environment_variables import (
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_METRICS_EXPORTER,
)
from ...settings import quoted, text
from ..steps.tracker import PHASES, Step

_log = logging.getLogger(__name__)

#: Recorded at each step (not bridged).
DIRECT = (
    "otelprof.step.duration",
    "otelprof.step.phase.duration",
    "otelprof.steps",
    "otelprof.samples",
    "otelprof.tokens",
    "otelprof.micro_batches",
)
#: Prometheus families bridged as observable instruments: (name, counter?). The per-second
#: gauges are left out: over OTLP, rates come from the counters.
BRIDGED = (
    ("otelprof_last_step_timestamp_seconds", False),
    ("otelprof_process_cpu_seconds", True),
    ("otelprof_process_max_rss_bytes", False),
    ("otelprof_gpu_memory_allocated_bytes", False),
    ("otelprof_gpu_memory_reserved_bytes", False),
    ("otelprof_gpu_memory_peak_bytes", False),
    ("otelprof_gpu_memory_total_bytes", False),
    ("otelprof_step_spans_dropped", True),
    ("otelprof_eval_forwards", True),
    ("otelprof_skipped_updates", True),
    ("otelprof_profiling_windows", True),
    ("otelprof_profiling_windows_failed", True),
    ("otelprof_profiling_window_overhead_seconds", True),
    ("otelprof_profiling_window_last_timestamp_seconds", False),
    ("otelprof_window_op_self_cpu_seconds", False),
    ("otelprof_window_op_self_device_seconds", False),
    ("otelprof_window_kernel_device_seconds", False),
    ("otelprof_window_gpu_busy_ratio", False),
    ("otelprof_straggler_ratio", False),
    ("otelprof_export_requests", True),
    ("otelprof_export_retries", True),
    ("otelprof_export_spans_rejected", True),
    ("otelprof_export_spool_evicted_requests", True),
    ("otelprof_export_queue_requests", False),
    ("otelprof_export_spool_bytes", False),
)
_UNITS = (("_per_second", "1/s"), ("_seconds", "s"), ("_bytes", "By"), ("_ratio", "1"))


def otel_name(prometheus_name: str) -> tuple[str, str]:
    """(OTel instrument name, UCUM unit) of a Prometheus family name."""
    for suffix, unit in _UNITS:
        if prometheus_name.endswith(suffix):
            return prometheus_name[: -len(suffix)].replace("_", "."), unit
    return prometheus_name.replace("_", "."), "1"


def exporters(environ: Mapping[str, str]) -> set[str]:
    """The metric exporters ``OTEL_METRICS_EXPORTER`` names (unset: ``prometheus``)."""
    raw = (text(environ, OTEL_METRICS_EXPORTER) or "prometheus").lower()
    names = {v.strip() for v in raw.split(",") if v.strip()}
    unknown = names - {"prometheus", "otlp", "none"}
    if unknown:
        _log.warning("%s: ignoring unknown exporter(s) %s", OTEL_METRICS_EXPORTER, quoted(",".join(sorted(unknown))))
    return names & {"prometheus", "otlp"}


class OtlpMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        labels: Mapping[str, str],
        resource: Mapping[str, Any],
        environ: Mapping[str, str],
    ) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        from ..._version import __version__

        self._labels = dict(labels)
        self._phase_labels = {phase: {**labels, "phase": phase} for phase in PHASES}
        self._registry = registry
        self._lock = threading.Lock()
        self._samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        self._read_at = float("-inf")
        reader = PeriodicExportingMetricReader(_exporter(environ))
        # no exit handler of the SDK's: registered after otelprof's, it would run first and
        # export before the session closes the last step (Session.close shuts this down)
        self.provider = MeterProvider(
            resource=Resource.create(dict(resource)), metric_readers=[reader], shutdown_on_exit=False
        )
        meter = self.provider.get_meter("otelprof", __version__)
        self._duration = meter.create_histogram("otelprof.step.duration", "s", "Training step wall time.")
        self._phase = meter.create_histogram("otelprof.step.phase.duration", "s", "Time per step in each phase.")
        self._steps = meter.create_counter("otelprof.steps", "1", "Training steps completed.")
        self._samples_total = meter.create_counter("otelprof.samples", "1", "Samples processed.")
        self._tokens_total = meter.create_counter("otelprof.tokens", "1", "Tokens processed.")
        self._micro_batches = meter.create_counter(
            "otelprof.micro_batches", "1", "DataLoader batches (micro-batches) of the steps completed."
        )
        for family, counter in BRIDGED:
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
        self._duration.record(seconds, labels, trace.set_span_in_context(span))
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
            self.provider.shutdown(timeout_millis=max(0.0, timeout_s) * 1000)
        except Exception:
            _log.warning("otelprof: shutting the OTLP metrics down failed", exc_info=True)

    def _callback(self, family: str) -> Any:
        from opentelemetry.metrics import Observation

        def observe(_options: Any) -> Iterable[Observation]:
            return [Observation(value, labels) for labels, value in self._read(family)]

        return observe

    def _read(self, family: str) -> list[tuple[dict[str, str], float]]:
        """The registry's samples of ``family``, collected once per export (callbacks run in a row)."""
        with self._lock:
            if time.monotonic() - self._read_at > 1.0:
                samples: dict[str, list[tuple[dict[str, str], float]]] = {}
                for metric in self._registry.collect():
                    for s in metric.samples:
                        if s.name in (metric.name, metric.name + "_total"):
                            samples.setdefault(metric.name, []).append((dict(s.labels), float(s.value)))
                self._samples, self._read_at = samples, time.monotonic()
            return self._samples.get(family, [])


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
