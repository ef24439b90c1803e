"""The exporter's own health as Prometheus metrics (prometheus-client), in the registry the
step metrics use too. Names follow Prometheus conventions: base units, ``_total`` counters."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import ClassVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

#: Outcomes of a request, the ``result`` label of ``otelprof_export_requests_total``.
RESULTS = ("exported", "spooled", "replayed", "dropped")
#: Why a request was lost for good, the ``reason`` of ``otelprof_export_dropped_requests_total``.
DROP_REASONS = (
    "rejected",  # the backend refused it (not retryable)
    "queue_full",  # the export queue and the spool writer were both full
    "spool_unwritable",  # it had to be spooled and the spool refused it (read-only, full disk, ...)
    "spool_too_large",  # it had to be spooled and is larger than the whole spool
    "spool_evicted",  # it was spooled, then evicted (the oldest) to make room in a full spool
    "disabled",  # OTEL_SDK_DISABLED=true
    "error",  # an unexpected error in otelprof
)


class ExporterMetrics:
    """One set per registry (a registry refuses duplicate names): use :meth:`for_registry`."""

    _by_registry: ClassVar[weakref.WeakKeyDictionary[CollectorRegistry, ExporterMetrics]] = weakref.WeakKeyDictionary()
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def for_registry(cls, registry: CollectorRegistry | None = None) -> ExporterMetrics:
        """The metrics in ``registry`` (default: prometheus-client's global one)."""
        registry = REGISTRY if registry is None else registry
        with cls._lock:
            metrics = cls._by_registry.get(registry)
            if metrics is None:
                metrics = cls._by_registry[registry] = cls(registry)
            return metrics

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "otelprof_export_requests",
            "OTLP export requests by what became of them.",
            ["result"],
            registry=registry,
        )
        for result in RESULTS:  # every series exists from the start (rate() needs a zero)
            self.requests.labels(result=result)
        self.dropped = Counter(
            "otelprof_export_dropped_requests",
            "OTLP export requests lost for good, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in DROP_REASONS:
            self.dropped.labels(reason=reason)
        self.worker_errors = Counter(
            "otelprof_export_worker_errors",
            "Unexpected errors the export worker survived (logged once).",
            registry=registry,
        )
        self.spans_rejected = Counter(
            "otelprof_export_spans_rejected", "Spans the backend refused in partial successes.", registry=registry
        )
        self.retries = Counter(
            "otelprof_export_retries", "Export attempts repeated after a retryable failure.", registry=registry
        )
        self.spool_evicted = Counter(
            "otelprof_export_spool_evicted_requests",
            "Spooled requests evicted because the spool was full.",
            registry=registry,
        )
        self.duration = Histogram(
            "otelprof_export_duration_seconds",
            "Time of one export attempt.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.queue_depth = Gauge("otelprof_export_queue_requests", "Requests waiting in memory.", registry=registry)
        self.spool_bytes = Gauge("otelprof_export_spool_bytes", "Bytes of requests in the spool.", registry=registry)

    def watch(self, queue_depth: Callable[[], float], spool_bytes: Callable[[], float]) -> None:
        """Gauges read at scrape time, so the hot path never updates them."""
        self.queue_depth.set_function(queue_depth)
        self.spool_bytes.set_function(spool_bytes)
