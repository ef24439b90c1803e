"""Always-on step metrics in the prometheus-client registry.

Every series carries ``run``, ``rank`` and ``local_rank`` (one value each per process), and
phase series add ``phase`` (four values): a rank exposes a fixed, small set of series whatever
the world size. Step-duration observations carry the step's trace id as an OpenMetrics
exemplar, so a dashboard can jump from a slow bucket to that step's trace.
"""

from __future__ import annotations

import resource
from collections.abc import Iterable, Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .steps import PHASES, Step

LABELS = ("run", "rank", "local_rank")
#: From 1 ms to 10 minutes: tiny CPU steps to giant LLM steps.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class StepMetrics:
    def __init__(self, labels: Mapping[str, str], registry: CollectorRegistry = REGISTRY) -> None:
        values = [labels[k] for k in LABELS]
        self._registry = registry
        self._registered: list[Collector] = []

        def add(metric: Collector) -> Collector:
            self._registered.append(metric)
            return metric

        duration = add(
            Histogram(
                "otelprof_step_duration_seconds",
                "Training step wall time.",
                LABELS,
                registry=registry,
                buckets=STEP_BUCKETS,
            )
        )
        phase = add(
            Histogram(
                "otelprof_step_phase_duration_seconds",
                "Time per step in each phase (data wait, forward, backward, optimizer).",
                (*LABELS, "phase"),
                registry=registry,
                buckets=STEP_BUCKETS,
            )
        )
        steps = add(Counter("otelprof_steps", "Training steps completed.", LABELS, registry=registry))
        last = add(
            Gauge(
                "otelprof_last_step_timestamp_seconds",
                "When the last step ended (Unix time).",
                LABELS,
                registry=registry,
            )
        )
        samples = add(Counter("otelprof_samples", "Samples processed.", LABELS, registry=registry))
        tokens = add(Counter("otelprof_tokens", "Tokens processed.", LABELS, registry=registry))
        samples_rate = add(
            Gauge("otelprof_samples_per_second", "Samples per second in the last step.", LABELS, registry=registry)
        )
        dropped = add(
            Counter(
                "otelprof_step_spans_dropped",
                "Step spans dropped because the encoder fell behind.",
                LABELS,
                registry=registry,
            )
        )
        tokens_rate = add(
            Gauge("otelprof_tokens_per_second", "Tokens per second in the last step.", LABELS, registry=registry)
        )
        assert isinstance(duration, Histogram) and isinstance(phase, Histogram)
        assert isinstance(steps, Counter) and isinstance(samples, Counter) and isinstance(tokens, Counter)
        assert isinstance(dropped, Counter)
        assert isinstance(last, Gauge) and isinstance(samples_rate, Gauge) and isinstance(tokens_rate, Gauge)
        self.step_duration = duration.labels(*values)
        self.phases = {p: phase.labels(*values, p) for p in PHASES}
        self.steps = steps.labels(*values)
        self.last_step = last.labels(*values)
        self.samples = samples.labels(*values)
        self.tokens = tokens.labels(*values)
        self.samples_rate = samples_rate.labels(*values)
        self.tokens_rate = tokens_rate.labels(*values)
        self.spans_dropped = dropped.labels(*values)
        self.add_collector(_ResourceCollector(labels))

    def add_collector(self, collector: Collector) -> None:
        """Registers ``collector`` with these series (and removes it with them)."""
        self._registry.register(collector)
        self._registered.append(collector)

    def observe(self, step: Step, trace_id: bytes) -> None:
        seconds = step.duration_s
        self.step_duration.observe(seconds, exemplar={"trace_id": trace_id.hex()})
        self.steps.inc()
        for phase, ns in step.phase_totals_ns.items():
            self.phases[phase].observe(ns / 1e9)
        self.last_step.set(step.end_ns / 1e9)
        if step.samples is not None:
            self.samples.inc(step.samples)
            if seconds > 0:
                self.samples_rate.set(step.samples / seconds)
        if step.tokens is not None:
            self.tokens.inc(step.tokens)
            if seconds > 0:
                self.tokens_rate.set(step.tokens / seconds)

    def unregister(self) -> None:
        """Removes every series this created (uninstrument)."""
        for metric in self._registered:
            self._registry.unregister(metric)
        self._registered.clear()


class _ResourceCollector(Collector):
    """Read at scrape time: process CPU and peak RSS, and per-device CUDA memory."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self._labels = [labels[k] for k in LABELS]

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = CounterMetricFamily("otelprof_process_cpu_seconds", "Process user + system CPU time.", labels=LABELS)
        cpu.add_metric(self._labels, usage.ru_utime + usage.ru_stime)
        rss = GaugeMetricFamily("otelprof_process_max_rss_bytes", "Peak resident set size.", labels=LABELS)
        rss.add_metric(self._labels, usage.ru_maxrss * 1024)
        yield cpu
        yield rss
        yield from _cuda_memory(self._labels)


def _cuda_memory(labels: list[str]) -> Iterable[GaugeMetricFamily]:
    import sys

    torch = sys.modules.get("torch")  # never import torch at scrape time
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    families = {
        "allocated": GaugeMetricFamily(
            "otelprof_gpu_memory_allocated_bytes", "CUDA memory held by tensors.", labels=[*LABELS, "device"]
        ),
        "reserved": GaugeMetricFamily(
            "otelprof_gpu_memory_reserved_bytes",
            "CUDA memory held by the caching allocator.",
            labels=[*LABELS, "device"],
        ),
        "peak": GaugeMetricFamily(
            "otelprof_gpu_memory_peak_bytes", "Peak CUDA memory held by tensors.", labels=[*LABELS, "device"]
        ),
        "total": GaugeMetricFamily(
            "otelprof_gpu_memory_total_bytes", "The device's memory capacity.", labels=[*LABELS, "device"]
        ),
    }
    for device in range(torch.cuda.device_count()):
        d = [*labels, str(device)]
        families["allocated"].add_metric(d, torch.cuda.memory_allocated(device))
        families["reserved"].add_metric(d, torch.cuda.memory_reserved(device))
        families["peak"].add_metric(d, torch.cuda.max_memory_allocated(device))
        families["total"].add_metric(d, torch.cuda.get_device_properties(device).total_memory)
    yield from families.values()
