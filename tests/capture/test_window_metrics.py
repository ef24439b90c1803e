"""A profiling window's top operators, kernels and GPU busy share, from the native core's
aggregates of real traces (a shared H100 trace) and of a live CPU window."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import KINETO_DIR as TRACES
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otelprof import convert
from otelprof.capture.metrics.window_metrics import MAX_NAME_CHARS, TOP_N, WindowMetrics, summarize
from otelprof.converter import OpStats

H100 = TRACES / "tracelens__tests__traces__h100__gaunernst_bert-small-uncased__1016001.json.gz"


def _device_events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


@pytest.mark.skipif(not H100.exists(), reason="shared traces absent")
def test_gpu_trace_kernels_and_busy_share_match_the_trace() -> None:
    summary = summarize(convert(H100).ops)
    kernels = _device_events(H100)  # kernels, memcpy and memset: the device rows
    kernel_s = sum(float(e["dur"]) for e in kernels) / 1e6  # the trace's own durations (us)
    assert summary.steps == 1
    assert summary.kernel_device_s  # top kernels named
    assert all(len(name) <= MAX_NAME_CHARS for name in summary.kernel_device_s)
    # every kernel's time is in a named kernel or in "other": the sum is the trace's kernel time
    assert sum(summary.kernel_device_s.values()) == pytest.approx(kernel_s, rel=1e-6)
    assert len(summary.kernel_device_s) <= TOP_N + 1
    assert summary.gpu_busy_ratio == pytest.approx(min(1.0, kernel_s / summary.wall_s), rel=1e-6)
    assert summary.gpu_busy_ratio is not None and 0 < summary.gpu_busy_ratio < 1
    # the heaviest operator on the device is the GEMM that launches most kernel time
    assert max(summary.op_self_device_s, key=summary.op_self_device_s.__getitem__) == "aten::addmm"
    assert "ProfilerStep*" not in summary.op_self_cpu_s


def test_top_n_keeps_the_heaviest_and_folds_the_rest_per_step() -> None:
    step = OpStats("ProfilerStep*", "annotation", "", 2, 4_000_000_000, 0, 0, 0)
    ops = [OpStats(f"op{i}", "op", "", 1, i * 2_000_000, i * 2_000_000, 0, 0) for i in range(1, 15)]
    ops.append(OpStats("op14", "op", "[[1]]", 1, 2_000_000, 2_000_000, 0, 0))  # shape-grouped row
    summary = summarize([step, *ops])
    assert summary.steps == 2 and summary.wall_s == 4.0
    assert summary.gpu_busy_ratio is None and summary.op_self_device_s == {} and summary.kernel_device_s == {}
    assert list(summary.op_self_cpu_s)[:2] == ["op14", "op13"]
    assert summary.op_self_cpu_s["op14"] == pytest.approx(0.030 / 2)  # both rows, per step
    assert len(summary.op_self_cpu_s) == TOP_N + 1
    assert summary.op_self_cpu_s["other"] == pytest.approx(sum(i * 0.002 for i in range(1, 5)) / 2)


def test_collector_counts_windows_by_trigger_and_replaces_the_last_window() -> None:
    registry = CollectorRegistry()
    metrics = WindowMetrics({"run": "r", "rank": "0", "local_rank": "0"})
    registry.register(metrics)
    labels = {"run": "r", "rank": "0", "local_rank": "0"}
    assert registry.get_sample_value("otelprof_profiling_windows_total", {**labels, "trigger": "schedule"}) == 0
    first = summarize([OpStats("a", "op", "", 1, 10, 10, 0, 0), OpStats("b", "op", "", 1, 5, 5, 0, 0)])
    metrics.window_done("schedule", first)
    metrics.window_done("anomaly", summarize([OpStats("c", "op", "", 1, 7, 7, 0, 0)]))
    metrics.window_failed()
    metrics.window_overhead(0.25)
    metrics.window_overhead(0.5)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert families["otelprof_profiling_window_overhead_seconds"].samples[0].value == 0.75
    windows = {s.labels["trigger"]: s.value for s in families["otelprof_profiling_windows"].samples}
    assert windows == {"early": 0, "schedule": 1, "on_demand": 0, "anomaly": 1, "user": 0}
    assert families["otelprof_profiling_windows_failed"].samples[0].value == 1
    skipped = {s.labels["reason"]: s.value for s in families["otelprof_windows_skipped"].samples}
    assert skipped == {"user_profiler": 0}  # zero before the first skip: the series exists
    ops = {s.labels["op"]: s.value for s in families["otelprof_window_op_self_cpu_seconds"].samples}
    assert ops == {"c": 7e-9}  # the last window only: "a" and "b" are gone
    assert "otelprof_window_gpu_busy_ratio" not in families
