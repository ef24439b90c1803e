"""What the last profiling window found, as Prometheus series: the top operators by self CPU
and self device time, the top kernels, and how busy the GPU was.

The numbers come from the native core's per-op aggregates (the ``key_averages()`` rows of
the converted window), normalised per profiled step so windows of different lengths compare.
Label cardinality is bounded: ``TOP_N`` names per family plus ``other``, and each window
replaces the previous one's series (a collector reads the latest summary at scrape time).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ...converter import OpStats

TOP_N = 10
#: Kernel names are C++ template instantiations hundreds of characters long.
MAX_NAME_CHARS = 120
TRIGGERS = ("early", "schedule", "on_demand", "anomaly", "user")  # user: trace_handler()
_STEP_ROW = "ProfilerStep*"


@dataclass(frozen=True)
class WindowSummary:
    steps: int
    wall_s: float  # the profiled steps' wall time
    op_self_cpu_s: dict[str, float] = field(default_factory=dict)  # per profiled step
    op_self_device_s: dict[str, float] = field(default_factory=dict)
    kernel_device_s: dict[str, float] = field(default_factory=dict)
    gpu_busy_ratio: float | None = None  # None: no device activity recorded


def summarize(ops: Sequence[OpStats]) -> WindowSummary:
    """A window's top operators and kernels, from its ``key_averages()`` rows."""
    step_rows = [o for o in ops if o.name == _STEP_ROW or o.name.startswith("ProfilerStep#")]
    steps = sum(o.calls for o in step_rows) or 1
    wall_ns = sum(o.cpu_total_ns for o in step_rows)
    op_rows = [o for o in ops if o.kind == "op"]
    kernels = [o for o in ops if o.kind == "device"]
    kernel_ns = sum(o.self_device_ns for o in kernels)
    busy = None
    if kernels and wall_ns > 0:
        # kernel time over wall time: kernels on overlapping streams count twice, hence the cap
        busy = min(1.0, kernel_ns / wall_ns)
    has_device = any(o.self_device_ns for o in op_rows)
    return WindowSummary(
        steps=steps,
        wall_s=wall_ns / 1e9,
        op_self_cpu_s=_top(op_rows, lambda o: o.self_cpu_ns, steps),
        op_self_device_s=_top(op_rows, lambda o: o.self_device_ns, steps) if has_device else {},
        kernel_device_s=_top(kernels, lambda o: o.self_device_ns, steps),
        gpu_busy_ratio=busy,
    )


def _top(rows: Sequence[OpStats], key: Callable[[OpStats], int], steps: int) -> dict[str, float]:
    totals: dict[str, int] = {}
    for row in rows:  # rows grouped by input shape repeat a name
        name = row.name[:MAX_NAME_CHARS]
        totals[name] = totals.get(name, 0) + key(row)
    ranked = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)
    top = {name: ns / steps / 1e9 for name, ns in ranked[:TOP_N] if ns > 0}
    rest = sum(ns for _, ns in ranked[TOP_N:])
    if rest > 0:
        top["other"] = top.get("other", 0.0) + rest / steps / 1e9
    return top


class WindowMetrics(Collector):
    """Counts windows by trigger and failures, and exposes the last window's summary."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self._names = list(labels)
        self._values = [labels[k] for k in self._names]
        self._lock = threading.Lock()
        self._done = dict.fromkeys(TRIGGERS, 0)
        self._failed = 0
        self._skipped: dict[str, int] = {"user_profiler": 0}
        self._overhead_s = 0.0
        self._not_kept = 0  # windows whose raw trace was not kept (capture/windows/keep.py)
        self._last: WindowSummary | None = None
        self._last_time: float | None = None
        # the last window's memory by device: (peak bytes by category, total at the peak)
        self._memory: dict[str, tuple[dict[str, int], int]] = {}
        self._memory_failed = 0

    def window_done(self, trigger: str, summary: WindowSummary) -> None:
        with self._lock:
            self._done[trigger] = self._done.get(trigger, 0) + 1
            self._last = summary
            self._last_time = time.time()

    def window_memory(self, peaks: Mapping[str, tuple[Mapping[str, int], int]]) -> None:
        """The last window's memory timeline (capture/memory/): by device, each category's peak
        and the total at the peak."""
        with self._lock:
            self._memory = {device: (dict(by), total) for device, (by, total) in peaks.items()}

    def memory_failed(self) -> None:
        with self._lock:
            self._memory_failed += 1

    def window_overhead(self, seconds: float) -> None:
        with self._lock:
            self._overhead_s += seconds

    def window_failed(self) -> None:
        with self._lock:
            self._failed += 1

    def trace_not_kept(self) -> None:
        with self._lock:
            self._not_kept += 1

    def window_skipped(self, reason: str) -> None:
        with self._lock:
            self._skipped[reason] = self._skipped.get(reason, 0) + 1

    def snapshot(self) -> tuple[dict[str, int], int, WindowSummary | None]:
        """(windows by trigger, windows failed, the last window's summary)."""
        with self._lock:
            return dict(self._done), self._failed, self._last

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        with self._lock:
            done, failed, last, when = dict(self._done), self._failed, self._last, self._last_time
            overhead, not_kept = self._overhead_s, self._not_kept
            skipped = dict(self._skipped)
            memory, memory_failed = dict(self._memory), self._memory_failed
        names, values = self._names, self._values
        windows = CounterMetricFamily(
            "otelprof_profiling_windows", "Profiling windows converted and exported.", labels=[*names, "trigger"]
        )
        for trigger, count in done.items():
            windows.add_metric([*values, trigger], count)
        yield windows
        yield _counter(
            "otelprof_profiling_windows_failed",
            "Profiling windows lost (saving or converting failed, or the conversion queue was full).",
            names,
            values,
            failed,
        )
        skips = CounterMetricFamily(
            "otelprof_windows_skipped",
            "Profiling windows not recorded, by reason (user_profiler: another profiler was on in "
            "the process, or started during the window, which then gave way to it).",
            labels=[*names, "reason"],
        )
        for reason, count in skipped.items():
            skips.add_metric([*values, reason], count)
        yield skips
        yield _counter(
            "otelprof_profiling_window_overhead_seconds",
            "Training-thread time spent starting and stopping profiling windows (Kineto's start and "
            "stop at step boundaries; traces are saved and converted on a background thread).",
            names,
            values,
            overhead,
        )
        yield _counter(
            "otelprof_window_traces_not_kept",
            "Profiling windows whose raw Kineto trace was not kept (OTELPROF_TRACE_DIR unwritable, full or "
            "refused, or the trace over OTELPROF_KEEP_TRACES_MAX_BYTES; logged once); the window was still sent.",
            names,
            values,
            not_kept,
        )
        yield _counter(
            "otelprof_window_memory_timeline_failed",
            "Profiling windows with profile_memory whose memory timeline failed (torch without its memory "
            "profiler, or torch raised; logged once); the window was still sent.",
            names,
            values,
            memory_failed,
        )
        yield from _memory_families(names, values, memory)
        if last is not None and when is not None:
            yield from _last_window_families(names, values, last, when)


def _last_window_families(
    names: list[str], values: list[str], last: WindowSummary, when: float
) -> Iterable[GaugeMetricFamily]:
    """The last converted window's gauges: when, its top ops and kernels, GPU busy ratio."""
    yield _gauge(
        "otelprof_profiling_window_last_timestamp_seconds",
        "When the last profiling window was converted (Unix time).",
        names,
        values,
        when,
    )
    for metric, doc, label, series in (
        ("otelprof_window_op_self_cpu_seconds", "Self CPU", "op", last.op_self_cpu_s),
        ("otelprof_window_op_self_device_seconds", "Self device", "op", last.op_self_device_s),
        ("otelprof_window_kernel_device_seconds", "Device", "kernel", last.kernel_device_s),
    ):
        if not series:
            continue
        help_text = f"{doc} time per profiled step of the last window's top {label}s (the rest: {label}=other)."
        family = GaugeMetricFamily(metric, help_text, labels=[*names, label])
        for name, seconds in series.items():
            family.add_metric([*values, name], seconds)
        yield family
    if last.gpu_busy_ratio is not None:
        yield _gauge(
            "otelprof_window_gpu_busy_ratio",
            "Kernel time over wall time in the last window's profiled steps (0..1).",
            names,
            values,
            last.gpu_busy_ratio,
        )


def _memory_families(
    names: list[str], values: list[str], memory: Mapping[str, tuple[Mapping[str, int], int]]
) -> Iterable[GaugeMetricFamily]:
    if not memory:
        return
    peak = GaugeMetricFamily(
        "otelprof_window_memory_peak_bytes",
        "Peak bytes of each memory category (torch's memory timeline) in the last window with profile_memory.",
        labels=[*names, "device", "category"],
    )
    total = GaugeMetricFamily(
        "otelprof_window_memory_total_peak_bytes",
        "Bytes held, all categories, at the peak of the last window with profile_memory.",
        labels=[*names, "device"],
    )
    for device, (by_category, at_peak) in sorted(memory.items()):
        for category, size in by_category.items():
            peak.add_metric([*values, device, category], size)
        total.add_metric([*values, device], at_peak)
    yield peak
    yield total


def _counter(name: str, doc: str, names: list[str], values: list[str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=names)
    family.add_metric(values, value)
    return family


def _gauge(name: str, doc: str, names: list[str], values: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=names)
    family.add_metric(values, value)
    return family
