"""Per-step memory peaks (capture/memory/peaks.py): the guest shims' arithmetic, a simulated
caching allocator through the wrapped torch._C entry points, and real CPU loops (both step
routes) whose resident peaks are decoded from the receiver and the process's own getrusage."""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import native_module
from export.receivers import http_receiver
from fresh_process import in_a_fresh_process
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.capture.memory import peaks as memory_peaks
from otelprof.capture.memory.peaks import CudaPeaks, fold_peaks, rusage_with_kept, step_peaks, vm_hwm_kib, with_kept

from . import live_session

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MIB = 1 << 20


def _stats(current: int, peak: int, reserved: int, reserved_peak: int) -> dict[str, Any]:
    """The shape of torch._C._cuda_memoryStats (a part of it)."""
    return {
        "num_alloc_retries": 0,
        "allocated_bytes": {
            "all": {"current": current, "peak": peak, "allocated": peak, "freed": 0},
            "large_pool": {"current": current, "peak": peak, "allocated": peak, "freed": 0},
        },
        "reserved_bytes": {"all": {"current": reserved, "peak": reserved_peak, "allocated": 0, "freed": 0}},
    }


def test_fold_and_merge_keep_every_peak_and_nothing_else() -> None:
    kept: memory_peaks.Kept = {}
    fold_peaks(kept, _stats(10, 100, 200, 300))
    fold_peaks(kept, _stats(10, 40, 200, 400))  # after a reset: lower allocated, higher reserved
    assert kept == {
        ("allocated_bytes", "all", "peak"): 100,
        ("allocated_bytes", "large_pool", "peak"): 100,
        ("reserved_bytes", "all", "peak"): 400,
    }
    now = _stats(60, 60, 200, 200)
    seen = with_kept(now, kept)
    assert seen["allocated_bytes"]["all"] == {"current": 60, "peak": 100, "allocated": 60, "freed": 0}
    assert seen["reserved_bytes"]["all"]["peak"] == 400
    assert seen["num_alloc_retries"] == 0
    assert now["allocated_bytes"]["all"]["peak"] == 60  # not changed in place
    assert with_kept(_stats(500, 900, 0, 0), kept)["allocated_bytes"]["all"]["peak"] == 900
    assert step_peaks(now) == (60, 200) and step_peaks({}) == (None, None)


class _Allocator:
    """A caching allocator's peak bookkeeping, as torch._C exposes it (stands in for CUDA)."""

    def __init__(self) -> None:
        self.current = self.peak = 0

    def alloc(self, n: int) -> None:
        self.current += n
        self.peak = max(self.peak, self.current)

    def _cuda_memoryStats(self, device: int) -> dict[str, Any]:
        assert device == 0
        return _stats(self.current, self.peak, self.current, self.peak)

    def _cuda_resetPeakMemoryStats(self, device: int) -> None:
        self.peak = self.current


def test_the_user_reads_peaks_as_without_otelprof() -> None:
    c = _Allocator()
    original_stats, original_reset = c._cuda_memoryStats, c._cuda_resetPeakMemoryStats
    shim = CudaPeaks(c)
    c.alloc(100)
    c.alloc(-90)
    assert shim.read(0) == (100, 100)  # step 1's peak; the allocator's peak is now 10
    c.alloc(50)
    assert c._cuda_memoryStats(0)["allocated_bytes"]["all"]["peak"] == 100  # the user's: lifetime
    assert shim.read(0) == (60, 60)  # step 2's
    c._cuda_resetPeakMemoryStats(0)  # the user's reset: from now on, peaks since it
    c.alloc(5)
    assert c._cuda_memoryStats(0)["allocated_bytes"]["all"]["peak"] == 65
    assert shim.read(0) == (65, 65)
    shim.uninstall()
    assert c._cuda_memoryStats == original_stats and c._cuda_resetPeakMemoryStats == original_reset


def test_vm_hwm_and_the_rusage_shim() -> None:
    assert vm_hwm_kib(b"Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t  12345 kB\nVmRSS:\t 100 kB\n") == 12345
    assert vm_hwm_kib(b"Name:\tpython\n") is None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    raised = rusage_with_kept(usage, usage.ru_maxrss + 7)
    assert raised.ru_maxrss == usage.ru_maxrss + 7 and raised.ru_utime == usage.ru_utime
    assert rusage_with_kept(usage, 1) is usage


_STATUS_TEXT = st.text(alphabet=" \t\n_+-0123456789kBVmHWM:x", max_size=40)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_STATUS_TEXT, st.sampled_from(["VmHWM:", "kB", "\t 12345 ", "9" * 19])), max_size=6))
def test_the_native_vm_hwm_parse_is_the_pythons(parts: list[str]) -> None:
    """memory_peaks.vm_hwm_kib and its C++ twin (StepSink.vm_hwm_kib) agree on any text
    (values within int64: /proc's are)."""
    status = "".join(parts).encode()
    expected = vm_hwm_kib(status)
    if expected is not None and abs(expected) >= 1 << 63:
        return
    assert native_module().StepSink.vm_hwm_kib(status) == expected


_EXEC = """
import os, sys
buffer = bytearray(300 << 20)
buffer[::4096] = b"\\1" * ((300 << 20) // 4096)  # resident: every page touched
os.execv(sys.executable, [sys.executable, "-c", *sys.argv[1:]])
"""
_AFTER_EXEC = """
import json, resource, sys
from otelprof._native import StepSink
from otelprof.capture.memory.peaks import ResidentPeaks
sink = StepSink(10, 10) if sys.argv[1] == "native" else None
peaks = ResidentPeaks(sink)
steps = [peaks.read() for _ in range(3)]
exact = sink.resident_exact if sink is not None else peaks._exact
maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"steps": steps, "maxrss": maxrss, "exact": exact}))
"""


@pytest.mark.slow  # a subprocess
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's clear_refs")
@pytest.mark.parametrize("route", ["native", "python"])
def test_the_mark_kept_at_exec_is_not_a_steps(route: str) -> None:
    """A launcher that held 300 MiB exec's the training process: the kernel's ru_maxrss keeps
    its mark for good, so the steps' peaks come from VmHWM; the process's own reading still
    reads as without otelprof."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _EXEC, _AFTER_EXEC, route], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["maxrss"] >= 300 * MIB
    assert all(0 < step < 200 * MIB for step in out["steps"]), out
    assert out["exact"] is True  # VmHWM from the first comparison on


def _loop(buffer_step: int, steps: int) -> None:
    """A CPU training loop that touches a 96 MiB buffer in one step only."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        if i == buffer_step:
            big = torch.ones(96 * MIB // 4)
            del big
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.slow  # real torch
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's clear_refs")
@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@in_a_fresh_process  # the resident set's mark is process-wide
def test_each_step_carries_its_resident_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    pytest.importorskip("torch")
    from otelprof.capture import session as session_module
    from otelprof.capture.steps.native_tracker import step_tracker

    if not native:
        monkeypatch.setattr(session_module, "step_tracker", functools.partial(step_tracker, native=False))
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp_path / "spool", OTELPROF_PROFILE="false", OTELPROF_RUN_ID="peaks")
        _loop(buffer_step=3, steps=6)
        labels = {**session.identity.labels(), "device": "cpu", "kind": "resident"}
        gauge = session.registry.get_sample_value("otelprof_step_memory_peak_bytes", labels)
        assert session.peaks is not None and session.peaks.last is not None
        # the process's own reading still has the buffer (its high-water mark was reset per step)
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        # and otelprof's own lifetime gauge
        rss_gauge = session.registry.get_sample_value("otelprof_process_max_rss_bytes", session.identity.labels())
        live_session.stop(session)
    peaks = {}
    for span in rec.spans:
        if span.name == "train.step":
            attrs = {kv.key: kv.value.int_value for kv in span.attributes}
            peaks[attrs["otelprof.step.number"]] = attrs["otelprof.memory.peak.resident_bytes"]
    assert sorted(peaks) == list(range(6))
    quiet = [peaks[n] for n in (1, 2, 4, 5)]
    assert peaks[3] - max(quiet) >= 90 * MIB  # the buffer's step, and only it
    assert gauge == peaks[5]  # the gauge: the last step's
    assert maxrss >= peaks[3] and rss_gauge is not None and rss_gauge >= peaks[3]
    assert session.peaks.resident is not None  # uninstrument: the original back
    assert resource.getrusage is not session.peaks.resident._user_getrusage


_CHILD = """
import json, resource, sys
import torch
import otelprof
if sys.argv[1] == "instrumented":
    otelprof.instrument()
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(5):
    if i == 1:
        big = torch.ones(BUFFER // 4)  # touched once, early
        del big
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
"""
BUFFER = 256 * MIB


@pytest.mark.slow  # two training subprocesses
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's clear_refs")
def test_getrusage_reads_as_without_otelprof(tmp_path: Path) -> None:
    """A buffer touched once early: the process's ru_maxrss still covers it under otelprof
    (without the shim it would read the resident set since the last step began)."""
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(
        OTEL_METRICS_EXPORTER="none",
        OTELPROF_PROFILE="false",
        OTELPROF_SPOOL_DIR=str(tmp_path / "spool"),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    script = _CHILD.replace("BUFFER", str(BUFFER))
    maxrss = {}
    for mode in ("bare", "instrumented"):
        done = subprocess.run(
            [sys.executable, "-c", script, mode], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        maxrss[mode] = json.loads(done.stdout.strip().splitlines()[-1]) * 1024
    assert maxrss["bare"] >= BUFFER
    assert maxrss["instrumented"] >= maxrss["bare"] - 8 * MIB  # otelprof only adds its own


def _step_attrs(native: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[int, dict[str, Any]], Any]:
    from otelprof.capture import session as session_module
    from otelprof.capture.steps.native_tracker import step_tracker

    monkeypatch.setattr(session_module, "step_tracker", functools.partial(step_tracker, native=native))
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp_path / "spool", OTELPROF_PROFILE="false", OTELPROF_RUN_ID="twin")
        _loop(buffer_step=3, steps=5)
        peaks = session.peaks
        live_session.stop(session)
    steps = {}
    for span in rec.spans:
        if span.name == "train.step":
            attrs = {kv.key: kv.value for kv in span.attributes}
            steps[attrs["otelprof.step.number"].int_value] = attrs
    return steps, peaks


@pytest.mark.slow  # real torch, two sessions
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's clear_refs")
@in_a_fresh_process  # the resident set's mark is process-wide
def test_both_routes_put_the_same_memory_attributes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The native sink's own resident reading and the Python probe's: the same attributes on
    every step span, the buffer's step the peak on both; natively, on a CPU-only run, the
    Python probe never ran."""
    pytest.importorskip("torch")
    native_steps, native_peaks = _step_attrs(True, tmp_path / "native", monkeypatch)
    python_steps, python_peaks = _step_attrs(False, tmp_path / "python", monkeypatch)
    assert sorted(native_steps) == sorted(python_steps) == list(range(5))
    memory = "otelprof.memory.peak.resident_bytes"
    for n in range(5):
        assert set(native_steps[n]) == set(python_steps[n])
        assert native_steps[n][memory].int_value > 0 and python_steps[n][memory].int_value > 0
    for steps in (native_steps, python_steps):
        assert steps[3][memory].int_value - max(steps[n][memory].int_value for n in (1, 2, 4)) >= 90 * MIB
    assert native_peaks._sink is not None and native_peaks._last is None  # no Python reading
    assert python_peaks._sink is None and python_peaks._last is not None


def test_the_native_probe_reads_what_torch_cuda_reads() -> None:
    """The native tracker calls the CUDA probe once ``vars(torch.cuda)["_initialized"]`` is
    True (session.py): the flag ``torch.cuda.is_initialized()`` reads, present in this torch."""
    torch = pytest.importorskip("torch")
    flags = vars(torch.cuda)
    assert "_initialized" in flags
    assert bool(flags["_initialized"]) == torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork()
