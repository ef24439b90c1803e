"""The benchmarks run, check their own results (span counts at the receiver) and print figures.

Only that they work is tested here; their numbers are read by people, never asserted (shared,
noisy machines).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import prereqs
import pytest
from converter_helpers import shared_trace

pytestmark = pytest.mark.slow  # each test runs a benchmark script in a subprocess

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> tuple[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the checkout, installed or not
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    return out.stdout, json.loads(lines[-1])


def test_export_benchmark_runs_both_paths() -> None:
    text, figures = _run("export.py", str(shared_trace("critical_path")), "--repeat", "1", "--sdk-spans", "300")
    assert set(figures) == {"otelprof_spans_per_s", "sdk_spans_per_s", "sdk-big_spans_per_s", "ratio"}
    assert all(v > 0 for v in figures.values())
    assert "otelprof / best SDK" in text


def test_convert_benchmark_prints_every_figure() -> None:
    text, figures = _run("convert.py", str(shared_trace("critical_path")), "--repeat", "1", "--sdk-spans", "300")
    assert figures["traces"] == figures["large_traces"] == 1  # no large trace: judged on the one given
    rates = (
        "bytes_spans_per_s",
        "bytes_mb_per_s",
        "two_threads_spans_per_s",
        "gz_spans_per_s",
        "gz_mb_per_s",
        "sdk_spans_per_s",
    )
    assert all(figures[k] > 0 for k in rates) and figures["native_over_sdk"] > 0
    assert "gz_slowdown_pct" in figures  # a difference: noise may make it < 0 on a small trace
    # the child's own memory (VmHWM), not the parent's: a few tens of MiB for a 0.3 MB trace
    assert 0 < figures["base_rss_mib"] <= figures["peak_rss_mib"] < 200 and figures["peak_over_payload"] > 0
    assert "targets    :" in text and "peak RSS <= 3x payload" in text and "critical_path" in text


def test_default_detail_benchmark_compares_two_builds() -> None:
    """Against itself as the baseline (a second build needs a wheel built): both workers convert
    the trace and the figures come back."""
    from otelprof._native_module import native

    if native is None:
        pytest.skip("the native module did not load")
    trace = str(shared_trace("critical_path"))
    text, figures = _run("convert_default.py", trace, "--baseline", native.__file__, "--repeat", "2")
    assert figures["this_ms"] > 0 and figures["baseline_ms"] > 0 and figures["ratio"] > 0
    assert "alexnet" in text and "(1 / 1 requests)" in text and "target <= 1.1" in text


def test_profiles_benchmark_measures_with_stack_windows() -> None:
    text, figures = _run("profiles.py", "--rounds", "2", "--window-steps", "2")
    assert {"with_stack_ratio", "profiles_on_off_ratio", "stacks_window_ms", "stacks_bert_h100_ms"} <= set(figures)
    assert all(v > 0 for k, v in figures.items() if not k.endswith("error"))
    assert "with_stack, ratio" in text and "stacks pass, live window" in text


def test_overhead_benchmark_runs_both_loops() -> None:
    quick = ("--rounds", "2", "--steps", "3", "--window-steps", "2", "--tiny-rounds", "3", "--window-rounds", "2")
    frameworks = ("--framework-rounds", "1", "--framework-steps", "3", "--start-rounds", "2")
    text, figures = _run("overhead.py", *quick, *frameworks)
    window = {"window_bare_ms", "window_otelprof_ms", "window_ratio", "window_ratio_error"}
    always = {"bare_ms", "instrumented_ms", "ratio", "ratio_error", "step_cost_us", "implied_ratio"}
    errors = {"step_cost_error_us", "implied_ratio_error"}
    framework = {"hf_trainer_bare_ms", "hf_trainer_ratio", "lightning_bare_ms", "lightning_ratio"}
    start = {"start_bare_ms", "start_bootstrap_ms", "start_otelprof_run_ms"}  # differences: noise may be < 0
    assert set(figures) == always | window | errors | framework | start
    differences = {"step_cost_us", "start_bootstrap_ms", "start_otelprof_run_ms"}
    assert all(v > 0 for k, v in figures.items() if not k.endswith("error") and k not in differences)
    assert all(figures[k] >= 0 for k in figures if "error" in k)
    assert "window, ratio" in text and "per-step cost" in text
    assert "hf_trainer, ratio" in text and "lightning, ratio" in text and "process start, bootstrap" in text


def test_overhead_benchmark_part_one_with_and_without_memory_peaks() -> None:
    """Part 1 only (the other parts 0 rounds); --memory-off: the tiny loop also without the peaks."""
    quick = ("--rounds", "2", "--steps", "3", "--tiny-rounds", "3", "--window-rounds", "0", "--framework-rounds", "0")
    text, figures = _run("overhead.py", *quick, "--start-rounds", "0", "--memory-off")
    always = {"bare_ms", "instrumented_ms", "ratio", "ratio_error", "step_cost_us", "implied_ratio"}
    errors = {"step_cost_error_us", "implied_ratio_error"}
    assert set(figures) == always | errors | {"memory_off_cost_us", "memory_off_implied_ratio"}
    assert figures["memory_off_implied_ratio"] > 0
    assert "peaks off (STEP_MEMORY)" in text and "window, ratio" not in text


def test_import_benchmark_runs_import_and_anchor() -> None:
    text, figures = _run(
        "import.py", str(shared_trace("critical_path")), str(shared_trace("amd_trace")), "--repeat", "1"
    )
    assert set(figures) == {"import_events_per_s", "convert_events_per_s", "ratio", "met"}
    assert all(figures[k] > 0 for k in ("import_events_per_s", "convert_events_per_s", "ratio"))
    assert "input      : 2 files, 1,628 trace events" in text and "import / convert" in text
    assert "target >= 0.8: met" in text or "target >= 0.8: NOT met" in text


def test_distributed_scale_benchmark_runs() -> None:
    trace = shared_trace("bert-small")
    text, figures = _run("distributed_scale.py", "--ranks", "4", "--steps", "7", "--trace", str(trace))
    scaled = cast(dict[str, Any], figures["scaled"])  # this benchmark's figures are per world size
    assert scaled["ranks"] == 4 and scaled["max_step_trace_spans"] == 6 * 4
    assert "limits      : all met" in text


def test_startup_benchmark_times_every_command() -> None:
    text, figures = _run("startup.py", "--rounds", "1")
    assert set(figures) == {"anchor_ms", "version_ms", "module_version_ms", "convert_ms"}
    assert all(v > 0 for v in figures.values())
    assert "interpreter start" in text and "target <= 120 ms" in text


def _simdjson() -> None:
    """simdjson's headers for parse_floor.py (libsimdjson-dev, from tests/prereqs.py)."""
    prereqs.header("/usr/include/simdjson.h")


def test_parse_floor_benchmark_parses_the_same_events_with_simdjson() -> None:
    _simdjson()
    trace = shared_trace("critical_path")
    text, figures = _run("parse_floor.py", str(trace), "--rounds", "1", "--sdk-spans", "300")
    # simdjson read the same document: as many events as Python's json finds
    assert figures["events"] == len(json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"])
    times = ("simdjson_parse_ms", "simdjson_visit_ms", "native_ms", "native_parse_ms", "sdk_spans_per_s")
    assert figures["spans"] > 0 and all(figures[k] > 0 for k in times)
    assert figures["ceiling_over_sdk"] > 0 and "ceiling    :" in text and "simdjson's DOM parse" in text
