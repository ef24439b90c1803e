"""FLOPs per step, achieved FLOP/s and MFU from with_flops windows: the FLOPs of Linear layers
of known shape equal the analytic count, on both metric paths, and the estimate between windows
is the window's FLOPs per step over a step's time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from export.receivers import http_receiver
from prometheus_client.parser import text_string_to_metric_families

from capture import live_session
from otelprof.capture.metrics.mfu import window_flops
from otelprof.capture.metrics.peak_flops import PEAKS, part, peak_flops

torch = pytest.importorskip("torch")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: input m x k, hidden h, output n
M, K, H, N = 16, 32, 64, 8
STEPS = 10
PEAK = 2.5e11  # OTELPROF_PEAK_FLOPS: the CPU has no table entry


def analytic_flops(m: int, k: int, h: int, n: int) -> int:
    """One step of Linear(k, h) -> ReLU -> Linear(h, n) on an m x k input that needs no
    gradient, loss ``sum()``: 2 * rows * inner * cols per matmul, as autograd runs them."""
    forward = 2 * m * k * h + 2 * m * h * n  # the two addmm
    second = 2 * m * n * h + 2 * n * m * h  # grad input (m x n @ n x h), grad weight (n x m @ m x h)
    first = 2 * h * m * k  # grad weight only (h x m @ m x k): the input needs no gradient
    return forward + second + first


def test_peak_table_matches_real_device_names() -> None:
    """The names torch.cuda.get_device_name() gives on these parts (CUDA and ROCm)."""
    cases = {
        "NVIDIA A100-SXM4-80GB": "A100",
        "NVIDIA A100-PCIE-40GB": "A100",
        "NVIDIA A100 80GB PCIe": "A100",
        "NVIDIA H100 80GB HBM3": "H100 SXM",
        "NVIDIA H100 PCIe": "H100 PCIe",
        "NVIDIA H100 NVL": "H100 NVL",
        "NVIDIA H200": "H200",
        "NVIDIA H200 NVL": "H200 NVL",
        "NVIDIA GH200 480GB": "GH200",
        "NVIDIA B200": "B200",
        "NVIDIA L4": "L4",
        "NVIDIA L40S": "L40S",
        "NVIDIA A10G": "A10G",
        "NVIDIA A10": "A10",
        "Tesla V100-SXM2-16GB": "V100 SXM2",
        "Tesla V100-SXM2-32GB": "V100 SXM2",
        "Tesla V100-PCIE-32GB": "V100 PCIe",
        "Tesla V100S-PCIE-32GB": "V100S PCIe",
        "AMD Instinct MI250X/MI250": "MI250X",
        "AMD Instinct MI250X": "MI250X",
        "AMD Instinct MI250": "MI250",
        "AMD Instinct MI300X": "MI300X",
        "AMD Instinct MI325X": "MI325X",
    }
    assert {name: part(name) for name in cases} == cases
    for unknown in ("NVIDIA GB200", "NVIDIA L40", "NVIDIA GeForce RTX 4090", "AMD Radeon Graphics", "cpu", ""):
        assert part(unknown) is None, unknown
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.5e12  # 1,979 with sparsity, halved
    assert peak_flops("NVIDIA H100 80GB HBM3", "tf32") == 494.5e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp16") == 312e12
    assert peak_flops("AMD Instinct MI300X", "bf16") == 1307.4e12
    assert peak_flops("NVIDIA H200", "fp8") == 1979e12
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # no BF16 tensor cores
    assert peak_flops("NVIDIA H100 PCIe", None) is None
    assert set(PEAKS) == set(cases.values())  # every part has a name that finds it


def test_window_flops_sum_each_whole_step() -> None:
    """torch's own results: every step's FLOPs once, the step the run ended in left out."""
    from torch.profiler import ProfilerActivity
    from torch.profiler.profiler import _KinetoProfile

    model = torch.nn.Sequential(torch.nn.Linear(K, H), torch.nn.ReLU(), torch.nn.Linear(H, N))
    x = torch.randn(M, K)
    prof = _KinetoProfile(activities=[ProfilerActivity.CPU], with_flops=True)
    prof.prepare_trace()
    prof.start_trace()
    for number in (7, 8, 9):
        with torch.profiler.record_function(f"ProfilerStep#{number}"):
            model(x).sum().backward()
    prof.stop_trace()
    assert prof.profiler is not None
    results = prof.profiler.kineto_results
    assert results is not None
    whole = window_flops(results)
    assert whole is not None
    assert (whole.steps, whole.flops, whole.device, whole.dtype) == (3, 3 * analytic_flops(M, K, H, N), "cpu", "fp32")
    assert whole.flops_per_step == analytic_flops(M, K, H, N)
    cut = window_flops(results, unfinished=9)
    assert cut is not None and (cut.steps, cut.flops) == (2, 2 * analytic_flops(M, K, H, N))
    assert 0 < cut.wall_s < whole.wall_s
    # backward nodes carry no FLOPs of their own: their aten::mm calls do
    counted = {e.name() for e in results.events() if e.flops()}
    assert counted == {"aten::addmm", "aten::mm"}


def _gauges(requests: list[Any]) -> dict[str, dict[tuple[str, str], float]]:
    """OTLP gauge name -> (device, source) -> value."""
    out: dict[str, dict[tuple[str, str], float]] = {}
    for request in requests:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.WhichOneof("data") != "gauge":
                        continue
                    for point in metric.gauge.data_points:
                        attrs = {kv.key: kv.value.string_value for kv in point.attributes}
                        if "source" in attrs:
                            key = (attrs["device"], attrs["source"])
                            out.setdefault(metric.name, {})[key] = point.as_double
    return out


def _scraped(text: str) -> dict[str, dict[tuple[str, str], float]]:
    out: dict[str, dict[tuple[str, str], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "source" in sample.labels:
                assert sample.labels["run"] == "mfu"
                out.setdefault(sample.name, {})[(sample.labels["device"], sample.labels["source"])] = sample.value
    return out


def test_flops_and_mfu_reach_both_paths(tmp_path: Path) -> None:
    with http_receiver() as rec:
        env = {
            **live_session.both_metric_paths(rec.port),
            "OTELPROF_RUN_ID": "mfu",
            "OTELPROF_PROFILE_OPTIONS": "with_flops",
            "OTELPROF_PEAK_FLOPS": str(PEAK),
            # one window, steps 3-4; the steps after it are estimated
            "OTELPROF_PROFILE_EARLY": "0",
            "OTELPROF_PROFILE_SKIP_FIRST": "2",
            "OTELPROF_PROFILE_WAIT": "0",
            "OTELPROF_PROFILE_WARMUP": "1",
            "OTELPROF_PROFILE_ACTIVE": "2",
            "OTELPROF_PROFILE_REPEAT": "1",
            "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
            "OTELPROF_TRACE_DIR": str(tmp_path / "traces"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        script = [
            sys.executable,
            str(HERE / "mfu_loop.py"),
            str(STEPS),
            str(tmp_path / "metrics.txt"),
            *map(str, (M, K, H, N)),
        ]
        out = subprocess.run(script, env=env, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr
    per_step = analytic_flops(M, K, H, N)
    step_s = sorted((s.end_time_unix_nano - s.start_time_unix_nano) / 1e9 for s in rec.spans if s.name == "train.step")
    assert len(step_s) == STEPS
    for path, got in (
        ("otlp", _gauges(rec.metric_requests)),
        ("scrape", _scraped((tmp_path / "metrics.txt").read_text())),
    ):
        names = ("otelprof.step.flops", "otelprof.achieved.flops", "otelprof.mfu")
        if path == "scrape":
            names = ("otelprof_step_flops", "otelprof_achieved_flops_per_second", "otelprof_mfu_ratio")
        flops, achieved, mfu = (got[name] for name in names)
        assert flops == {("cpu", "window"): per_step}, path
        assert set(achieved) == set(mfu) == {("cpu", "window"), ("cpu", "estimated")}, path
        for key, rate in achieved.items():
            assert mfu[key] == rate / PEAK, (path, key)
        assert achieved[("cpu", "window")] > 0, path  # the window's steps, under the profiler
        # estimated: the window's FLOPs per step over one step's time (the last step's, whose
        # span duration is in integer nanoseconds)
        seconds = per_step / achieved[("cpu", "estimated")]
        assert min(abs(seconds - s) for s in step_s) <= 2e-9, (path, seconds, step_s)
