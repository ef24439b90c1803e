"""Always-on step metrics in the prometheus-client registry.

Every series carries ``run``, ``rank`` and ``local_rank`` (one value each per process), and
phase series add ``phase`` (four values): a rank exposes a fixed, small set of series whatever
the world size. Step-duration observations carry the step's trace id as an OpenMetrics
exemplar, so a dashboard can jump from a slow bucket to that step's trace.

A step is queued (a deque append) and folded into plain numbers in batches of FOLD_STEPS, or at
the next scrape, which folds first so that what it reads is exact: code run once per 64 steps
stays in the CPU's caches, where once per step it ran cold, after the model's own work. The
registry reads the numbers as metric families at scrape time, all of them from one snapshot
(under one lock here, one copy of the native state), so series that move together (steps,
samples, tokens, micro-batches, a histogram's count and sum) agree within every scrape.
A step whose update a gradient scaler skipped is a step in every series (its time and batches
were spent; the phase histograms just see a short optimizer phase) and is also counted in
``otelprof_skipped_updates_total``, exposed from the first skipped update on (a loop without a
scaler never has the series, and the exposition stays prometheus-client's for the same steps).
prometheus-client's Histogram,
Counter and Gauge objects took ~8 us per step (a lock per bucket, counter and gauge, exemplar
validation); tests/capture/test_step_metrics.py checks that the exposition equals theirs for
the same observations.
"""

from __future__ import annotations

import resource
import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from ..steps.step import PHASES, Step

if TYPE_CHECKING:
    from ..._native import StepSinkMetrics

LABELS = ("run", "rank", "local_rank")
#: From 1 ms to 10 minutes: tiny CPU steps to giant LLM steps.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_LE: list[str] = [floatToGoString(b) for b in STEP_BUCKETS] + ["+Inf"]  # type: ignore[no-untyped-call]  # unannotated: prometheus_client
#: Steps queued before the training thread folds them into the series.
FOLD_STEPS = 64


def _no_trace_ids(_number: str) -> bytes:
    raise RuntimeError("read_from() was not called")


class Traced(Protocol):
    """A step's ids (step_spans.StepContext): the trace id is read at scrape time only."""

    @property
    def trace_id(self) -> bytes: ...


class Buckets:
    """One histogram series: per-bucket counts (cumulated at scrape), sum, and per bucket the
    latest exemplar (trace id, value, time), as prometheus-client's Histogram keeps them."""

    __slots__ = ("counts", "exemplars", "sum")

    def __init__(self) -> None:
        self.counts = [0] * len(_LE)
        self.sum = 0.0
        self.exemplars: list[tuple[Traced, float, float] | None] = [None] * len(_LE)

    def observe(self, value: float) -> int:
        """The bucket index ``value`` fell in (the first bound >= value; past the last, +Inf)."""
        i = bisect_left(STEP_BUCKETS, value)
        self.counts[i] += 1
        self.sum += value
        return i

    def add_to(
        self, family: HistogramMetricFamily, labels: Sequence[str], keep: Callable[[bytes], bool] | None = None
    ) -> None:
        """``keep``: whether a trace was sampled; an exemplar of one that was not is left out
        (it would link to a trace the backend never got)."""
        buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        total = 0
        for le, count, exemplar in zip(_LE, self.counts, self.exemplars, strict=True):
            total += count
            if exemplar is None or (keep is not None and not keep(exemplar[0].trace_id)):
                buckets.append((le, total))
            else:
                traced, value, at = exemplar
                buckets.append((le, total, Exemplar({"trace_id": traced.trace_id.hex()}, value, at)))
        family.add_metric(labels, buckets, self.sum)


class NativeSink(Protocol):
    """``_native.StepSink``: the metrics of the steps the native tracker folded."""

    def metrics(self) -> StepSinkMetrics: ...


class _Trace:
    __slots__ = ("trace_id",)

    def __init__(self, trace_id: bytes) -> None:
        self.trace_id = trace_id


#: (duration, phases, steps, samples, tokens, spans dropped, last step, samples/s, tokens/s,
#: micro-batches, skipped updates)
_State = tuple[
    "Buckets", "dict[str, Buckets]", int, int, int, int, "float | None", "float | None", "float | None", int, int
]


class StepMetrics(Collector):
    """Steps come through ``observe()`` (folded here), or, once ``read_from()`` is called, are
    folded by the native core (the same arithmetic; tests/capture/test_step_metrics.py)."""

    #: the trace sampler's decision (export/sampling.py); None: every trace is sent
    keep_exemplar: Callable[[bytes], bool] | None = None

    def __init__(self, labels: Mapping[str, str], registry: CollectorRegistry = REGISTRY) -> None:
        self._sink: NativeSink | None = None
        self._trace_ids: Callable[[str], bytes] = _no_trace_ids
        self._values = [labels[k] for k in LABELS]
        self._registry = registry
        self._registered: list[Collector] = []
        self._lock = threading.Lock()
        self._queue: deque[tuple[Step, Traced]] = deque()
        self._duration = Buckets()
        self._phases = {p: Buckets() for p in PHASES}
        self._steps = 0
        self._samples = 0
        self._tokens = 0
        self._micro_batches = 0
        self._skipped = 0
        self._eval_forwards: Callable[[], int] | None = None
        self._spans_dropped = 0
        self._last_step: float | None = None
        self._samples_rate: float | None = None
        self._tokens_rate: float | None = None
        self.add_collector(self)
        self.add_collector(_ResourceCollector(labels))

    def add_collector(self, collector: Collector) -> None:
        """Registers ``collector`` with these series (and removes it with them)."""
        self._registry.register(collector)
        self._registered.append(collector)

    def observe(self, step: Step, traced: Traced) -> None:
        if step.evaluation:  # a span, in no step metric (as the native sink)
            return
        queue = self._queue
        queue.append((step, traced))
        if len(queue) >= FOLD_STEPS:
            self._fold()

    def _fold(self) -> None:
        """Folds the queued steps into the series (appends and pops of a deque are atomic, so
        steps queued meanwhile by another thread wait for the next fold)."""
        queue = self._queue
        with self._lock:
            duration = self._duration
            phases = self._phases
            for _ in range(len(queue)):
                step, traced = queue.popleft()
                seconds = step.duration_s
                end = step.end_ns / 1e9
                duration.exemplars[duration.observe(seconds)] = (traced, seconds, end)
                self._steps += 1
                self._skipped += step.skipped
                for phase, ns in step.phase_totals_ns.items():
                    buckets, value = phases[phase], ns / 1e9  # Buckets.observe, inlined
                    buckets.counts[bisect_left(STEP_BUCKETS, value)] += 1
                    buckets.sum += value
                self._last_step = end
                self._micro_batches += step.micro_batches
                if step.samples is not None:
                    self._samples += step.samples
                    if seconds > 0:
                        self._samples_rate = step.samples / seconds
                if step.tokens is not None:
                    self._tokens += step.tokens
                    if seconds > 0:
                        self._tokens_rate = step.tokens / seconds

    def span_dropped(self) -> None:
        with self._lock:
            self._spans_dropped += 1

    def count_eval(self, read: Callable[[], int]) -> None:
        """``read()`` gives the forwards charged to no step (the tracker's ``eval_forwards``)."""
        self._eval_forwards = read

    def describe(self) -> Iterable[Metric]:
        return []  # collect() reads live values: the registry must not call it at registration

    def read_from(self, sink: NativeSink, trace_ids: Callable[[str], bytes]) -> None:
        """From now on the steps are folded by the native core (``_native.StepSink``, which the
        step tracker feeds directly); ``trace_ids`` hashes a step's own trace id from its number."""
        self._sink = sink
        self._trace_ids = trace_ids

    def collect(self) -> Iterable[Metric]:
        values = self._values
        self._fold()
        with self._lock:
            state = self._state() if self._sink is None else self._native_state(self._sink)
            (
                duration_buckets,
                phase_buckets,
                steps,
                samples,
                tokens,
                dropped,
                last,
                samples_rate,
                tokens_rate,
                batches,
                skipped,
            ) = state
            eval_forwards = 0 if self._eval_forwards is None else self._eval_forwards()
            duration = HistogramMetricFamily(
                "otelprof_step_duration_seconds", "Training step wall time.", labels=LABELS
            )
            duration_buckets.add_to(duration, values, self.keep_exemplar)
            phase = HistogramMetricFamily(
                "otelprof_step_phase_duration_seconds",
                "Time per step in each phase (data wait, forward, backward, optimizer).",
                labels=(*LABELS, "phase"),
            )
            for name, buckets in phase_buckets.items():
                buckets.add_to(phase, [*values, name])
            counters = [
                ("otelprof_steps", "Training steps completed.", steps),
                ("otelprof_samples", "Samples processed.", samples),
                ("otelprof_tokens", "Tokens processed.", tokens),
                ("otelprof_micro_batches", "DataLoader batches (micro-batches) of the steps completed.", batches),
                (
                    "otelprof_eval_forwards",
                    "Forward passes charged to no training step (evaluation, inference).",
                    eval_forwards,
                ),
                ("otelprof_step_spans_dropped", "Step spans dropped because the encoder fell behind.", dropped),
            ]
            if skipped:  # from the first skipped update on (a loop without a gradient scaler has none)
                counters.append(
                    (
                        "otelprof_skipped_updates",
                        "Steps whose optimizer update was skipped (a gradient scaler found inf/NaN gradients).",
                        skipped,
                    )
                )
            gauges = [
                ("otelprof_last_step_timestamp_seconds", "When the last step ended (Unix time).", last),
                ("otelprof_samples_per_second", "Samples per second in the last step.", samples_rate),
                ("otelprof_tokens_per_second", "Tokens per second in the last step.", tokens_rate),
            ]
        yield duration
        yield phase
        for name, doc, count in counters:
            counter = CounterMetricFamily(name, doc, labels=LABELS)
            counter.add_metric(values, count)
            yield counter
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=LABELS)
            gauge.add_metric(values, 0.0 if value is None else value)
            yield gauge

    def _state(self) -> _State:
        return (
            self._duration,
            self._phases,
            self._steps,
            self._samples,
            self._tokens,
            self._spans_dropped,
            self._last_step,
            self._samples_rate,
            self._tokens_rate,
            self._micro_batches,
            self._skipped,
        )

    def _native_state(self, sink: NativeSink) -> _State:
        m = sink.metrics()
        duration = Buckets()
        duration.counts, duration.sum = m.duration.counts, m.duration.sum
        for i, exemplar in enumerate(m.exemplars):
            if exemplar is not None:
                trace_id = exemplar.trace_id or self._trace_ids(str(exemplar.number))
                duration.exemplars[i] = (_Trace(trace_id), exemplar.value, exemplar.at)
        by_phase = {}
        for name, phase in zip(PHASES, m.phases, strict=True):
            buckets = by_phase[name] = Buckets()
            buckets.counts, buckets.sum = phase.counts, phase.sum
        return (
            duration,
            by_phase,
            m.steps,
            m.samples,
            m.tokens,
            m.spans_dropped + self._spans_dropped,
            m.last_step,
            m.samples_rate,
            m.tokens_rate,
            m.micro_batches,
            m.skipped,
        )

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
