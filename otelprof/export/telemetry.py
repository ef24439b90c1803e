"""The exporter's own health as Prometheus metrics (prometheus-client), in the registry the
step metrics use too. Names follow Prometheus conventions: base units, ``_total`` counters.
Every series carries ``signal`` (``traces``, ``profiles``): one process may run an exporter per
OTLP signal, and each one's losses, queue and spool are its own series in the same families."""

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
    "spool_unsafe",  # the spool folder is not private (a symlink, another owner, open to others)
    "spool_evicted",  # it was spooled, then evicted (the oldest) to make room in a full spool
    "disabled",  # OTEL_SDK_DISABLED=true
    "error",  # an unexpected error in otelprof
)


#: The OTLP signals an exporter sends, the ``signal`` label of every export series.
SIGNALS = ("traces", "profiles")


class ExporterMetrics:
    """One set per registry (a registry refuses duplicate names): use :meth:`for_registry`,
    then :meth:`signal` for one exporter's series."""

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
            ["signal", "result"],
            registry=registry,
        )
        self.dropped = Counter(
            "otelprof_export_dropped_requests",
            "OTLP export requests lost for good, by reason.",
            ["signal", "reason"],
            registry=registry,
        )
        self.worker_errors = Counter(
            "otelprof_export_worker_errors",
            "Unexpected errors the export worker survived (logged once).",
            ["signal"],
            registry=registry,
        )
        self.spans_rejected = Counter(
            "otelprof_export_spans_rejected",
            "Spans (profiles: samples) the backend refused in partial successes.",
            ["signal"],
            registry=registry,
        )
        self.retries = Counter(
            "otelprof_export_retries",
            "Export attempts repeated after a retryable failure.",
            ["signal"],
            registry=registry,
        )
        self.spool_evicted = Counter(
            "otelprof_export_spool_evicted_requests",
            "Spooled requests evicted because the spool was full.",
            ["signal"],
            registry=registry,
        )
        self.duration = Histogram(
            "otelprof_export_duration_seconds",
            "Time of one export attempt.",
            ["signal"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.queue_depth = Gauge(
            "otelprof_export_queue_requests", "Requests waiting in memory.", ["signal"], registry=registry
        )
        self.spool_bytes = Gauge(
            "otelprof_export_spool_bytes", "Bytes of requests in the spool.", ["signal"], registry=registry
        )

    def signal(self, signal: str) -> SignalMetrics:
        """One signal's series, every one of them present from the start (rate() needs a zero)."""
        return SignalMetrics(self, signal)


class SignalMetrics:
    """The series of one exporter (one OTLP signal) in its registry's families."""

    def __init__(self, families: ExporterMetrics, signal: str) -> None:
        self._families = families
        self.requests = {r: families.requests.labels(signal=signal, result=r) for r in RESULTS}
        self.dropped = {r: families.dropped.labels(signal=signal, reason=r) for r in DROP_REASONS}
        self.worker_errors = families.worker_errors.labels(signal=signal)
        self.spans_rejected = families.spans_rejected.labels(signal=signal)
        self.retries = families.retries.labels(signal=signal)
        self.spool_evicted = families.spool_evicted.labels(signal=signal)
        self.duration = families.duration.labels(signal=signal)
        self._signal = signal
        self._queue_depth = families.queue_depth.labels(signal=signal)
        self._spool_bytes = families.spool_bytes.labels(signal=signal)

    def drop(self, reason: str, amount: int) -> None:
        child = self.dropped.get(reason)
        if child is None:  # a reason new to DROP_REASONS is still counted
            child = self.dropped[reason] = self._families.dropped.labels(signal=self._signal, reason=reason)
        child.inc(amount)

    def watch(self, queue_depth: Callable[[], float], spool_bytes: Callable[[], float]) -> None:
        """Gauges read at scrape time, so the hot path never updates them (the latest exporter
        of this signal in the registry is the one read)."""
        self._queue_depth.set_function(queue_depth)
        self._spool_bytes.set_function(spool_bytes)
