"""The live path on a real GPU: run where CUDA is (the device tool), never in CI.

    python benchmarks/gpu_check.py [--steps N]

A small CUDA transformer trains under ``otelprof.instrument()`` with a profiling window at
steps 4-5, exporting to a spool folder; the script then decodes every request and checks:

- one ``train.step`` span per step, timed by CUDA events (no CPU fallback after the first
  step), each step's device duration within the CPU-measured loop time of the run;
- the window's kernel spans (``otelprof.event.category`` = ``kernel``) sit under the runtime
  call that launched them (``cudaLaunchKernel`` and friends), which sits under an ``aten::`` op,
  all in the profiled step's trace;
- the window metrics name kernels and report a GPU busy share in (0, 1];
- per-step CUDA memory peaks equal the script's own ``max_memory_allocated()`` around a step,
  which still reads the run's true peak (otelprof's shim), and a caught CUDA OOM is counted and
  marked on its step; a CUDA OOM that ends a child process (memory history on) is spooled as a
  failed step with the allocator's summary and the memory snapshot's file.

It prints the figures and exits non-zero on the first failed check.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client import CollectorRegistry

import otelprof
from otelprof.export.spool import Spool


def fail(message: str) -> None:
    print(f"FAIL: {message}")
    sys.exit(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: run this on a GPU machine")
        return 2
    spool_dir = Path(tempfile.mkdtemp(prefix="otelprof-gpu-check-"))
    env = {
        "OTELPROF_SPOOL_DIR": str(spool_dir),  # no endpoint: everything is spooled, then read back here
        "OTELPROF_RUN_ID": "gpu-check",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTELPROF_PROFILE_SKIP_FIRST": "3",
        "OTELPROF_PROFILE_WAIT": "0",
        "OTELPROF_PROFILE_WARMUP": "1",
        "OTELPROF_PROFILE_ACTIVE": "2",
        "OTELPROF_PROFILE_REPEAT": "1",
        "OTELPROF_ANOMALY_FACTOR": "0",
    }
    registry = CollectorRegistry()
    session = otelprof.instrument(environ=env, registry=registry)
    if session is None:
        fail("otelprof did not instrument")
    assert session is not None
    device = torch.device("cuda")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 256), torch.nn.TransformerEncoder(layer, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, 1000, (args.steps * 16, 128))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=16, pin_memory=True)
    started = time.perf_counter()
    for (batch,) in loader:
        model(batch.to(device, non_blocking=True)).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    loop_s = time.perf_counter() - started
    timing = session.timing
    windows = session.windows
    otelprof.uninstrument()
    fallbacks = timing.cpu_fallbacks if timing is not None else -1
    last = windows.metrics.snapshot()[2] if windows is not None and windows.metrics is not None else None
    assert session.exporter is not None
    session.exporter.shutdown()

    spans: list[Span] = []
    for _record, data_bytes in Spool(spool_dir):
        request = ExportTraceServiceRequest.FromString(data_bytes)
        spans.extend(s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
    by_id = {s.span_id: s for s in spans}
    steps = [s for s in spans if s.name == "train.step"]

    def category_of(span: Span) -> str:
        return next((kv.value.string_value for kv in span.attributes if kv.key == "otelprof.event.category"), "")

    category = Counter(category_of(s) for s in spans)
    kernels = [s for s in spans if category_of(s) == "kernel"]
    step_seconds = [(s.end_time_unix_nano - s.start_time_unix_nano) / 1e9 for s in steps]
    figures = {
        "steps": len(steps),
        "loop_seconds": round(loop_s, 3),
        "step_seconds_sum": round(sum(step_seconds), 3),
        "cuda_event_fallbacks": fallbacks,
        "spans": len(spans),
        "kernel_spans": len(kernels),
        "categories": dict(category.most_common(8)),
        "window": None
        if last is None
        else {"gpu_busy_ratio": last.gpu_busy_ratio, "top_kernels": last.kernel_device_s},
    }
    print(json.dumps(figures, indent=1))
    if timing is None:
        fail("CUDA-event timing is off")
    if len(steps) != args.steps:
        fail(f"{len(steps)} step spans for {args.steps} steps")
    if fallbacks > 1:
        fail(f"{fallbacks} steps fell back to CPU timing")
    if not 0 < sum(step_seconds) <= loop_s * 1.05:
        fail("device step times do not fit in the loop's wall time")
    if not kernels:
        fail("no kernel spans from the profiled window")
    for kernel in kernels:
        launch = by_id.get(kernel.parent_span_id)
        if launch is None or not launch.name.startswith(("cuda", "cu")):
            fail(f"kernel {kernel.name[:60]} is not under a runtime launch (parent {launch and launch.name})")
        assert launch is not None
        op = by_id.get(launch.parent_span_id)
        while op is not None and not op.name.startswith("aten::"):
            op = by_id.get(op.parent_span_id)
        if op is None:
            fail(f"launch {launch.name} of {kernel.name[:60]} has no aten:: op above it")
    busy = (last.gpu_busy_ratio if last is not None else None) or 0.0
    if not 0 < busy <= 1:
        fail(f"GPU busy share {busy}")
    print("OK: CUDA-event step times, kernels under their launching ops, window metrics")
    check_memory_categories(torch)
    check_memory_peaks(torch)
    check_uncaught_oom()
    return 0


def check_memory_categories(torch: Any) -> None:
    """A window with profile_memory on CUDA: the memory timeline's categories (capture/memory/)
    for an MLP whose sizes are known by construction (multiples of the caching allocator's
    512-byte rounding): parameters, gradients and Adam's two moments."""
    spool_dir = Path(tempfile.mkdtemp(prefix="otelprof-gpu-memory-"))
    env = {
        "OTELPROF_SPOOL_DIR": str(spool_dir),
        "OTELPROF_RUN_ID": "gpu-memory",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTELPROF_PROFILE_EARLY": "0",
        "OTELPROF_PROFILE_SKIP_FIRST": "2",
        "OTELPROF_PROFILE_WAIT": "0",
        "OTELPROF_PROFILE_WARMUP": "1",
        "OTELPROF_PROFILE_ACTIVE": "2",
        "OTELPROF_PROFILE_REPEAT": "1",
        "OTELPROF_PROFILE_OPTIONS": "profile_memory",
        "OTELPROF_ANOMALY_FACTOR": "0",
    }
    registry = CollectorRegistry()
    session = otelprof.instrument(environ=env, registry=registry)
    assert session is not None
    din, hidden, dout, batch = 1024, 2048, 512, 64
    model = torch.nn.Sequential(
        torch.nn.Linear(din, hidden, bias=False), torch.nn.ReLU(), torch.nn.Linear(hidden, dout, bias=False)
    ).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    x, y = torch.randn(batch, din, device="cuda"), torch.randn(batch, dout, device="cuda")
    for _ in range(8):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    windows = session.windows
    otelprof.uninstrument()
    if windows is not None:
        windows.conversions.close()
    assert session.exporter is not None
    session.exporter.shutdown()
    families = list(windows.metrics.collect()) if windows is not None and windows.metrics is not None else []
    peaks = {
        sample.labels["category"]: int(sample.value)
        for family in families
        for sample in family.samples
        if sample.name == "otelprof_window_memory_peak_bytes" and sample.labels.get("device", "").startswith("cuda")
    }
    params = 4 * (din * hidden + hidden * dout)
    print(json.dumps({"cuda_memory_categories": peaks, "parameter_bytes": params}, indent=1))
    if peaks.get("parameter") != params or peaks.get("gradient") != params:
        fail(f"CUDA parameter/gradient peaks {peaks.get('parameter')}/{peaks.get('gradient')}, built {params}")
    if not 2 * params <= peaks.get("optimizer_state", 0) <= 2 * params + 4096:  # + Adam's step tensors
        fail(f"CUDA optimizer-state peak {peaks.get('optimizer_state')}, built 2 x {params}")
    print("OK: CUDA memory by category equals the model's construction")


def _spooled_steps(spool_dir: Path) -> dict[int, Span]:
    """The ``train.step`` spans of a spool folder, by step number."""
    steps: dict[int, Span] = {}
    for _record, data_bytes in Spool(spool_dir):
        request = ExportTraceServiceRequest.FromString(data_bytes)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    if s.name == "train.step":
                        steps[next(kv.value.int_value for kv in s.attributes if kv.key == "otelprof.step.number")] = s
    return steps


def _attr(span: Any, key: str) -> Any:
    return next((kv.value for kv in span.attributes if kv.key == key), None)


def check_memory_peaks(torch: Any) -> None:
    """Per-step CUDA peaks (issue 36): steps 0-2 untouched by the script, a 1 GiB buffer in
    step 1: the script's own max_memory_allocated() after them is the run's true peak (otelprof
    reset the allocator's peak at each boundary, its shim adds them back); steps 3-5 between
    the script's own reset_peak_memory_stats() and max_memory_allocated(): equal to each
    step's span; step 6 catches a CUDA OOM: counted and marked on its span."""
    spool_dir = Path(tempfile.mkdtemp(prefix="otelprof-gpu-peaks-"))
    env = {
        "OTELPROF_SPOOL_DIR": str(spool_dir),
        "OTELPROF_RUN_ID": "gpu-peaks",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTELPROF_PROFILE": "false",
    }
    torch.cuda.reset_peak_memory_stats()  # the first check's run is not this one's
    registry = CollectorRegistry()
    session = otelprof.instrument(environ=env, registry=registry)
    assert session is not None
    device = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    measured: dict[int, int] = {}
    run_peak = caught = 0
    for i in range(7):
        if i >= 3:
            torch.cuda.reset_peak_memory_stats()
        x = torch.randn(512, 1024, device=device)
        if i == 1:
            big = torch.empty(1 << 30, dtype=torch.uint8, device=device)
            del big
        if i == 6:
            try:
                torch.empty(1 << 50, dtype=torch.uint8, device=device)
            except torch.OutOfMemoryError:
                caught += 1
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if i == 2:
            run_peak = torch.cuda.max_memory_allocated()
        if i >= 3:
            measured[i] = torch.cuda.max_memory_allocated()
    torch.cuda.synchronize()
    labels = {**session.identity.labels(), "device": "cuda:0"}
    ooms = registry.get_sample_value("otelprof_oom_total", labels)
    otelprof.uninstrument()
    assert session.exporter is not None
    session.exporter.shutdown()
    steps = _spooled_steps(spool_dir)
    peaks = {n: _attr(s, "otelprof.memory.peak.allocated_bytes") for n, s in steps.items()}
    peaks = {n: None if v is None else v.int_value for n, v in peaks.items()}
    reserved = {n: _attr(s, "otelprof.memory.peak.reserved_bytes") for n, s in steps.items()}
    marked = {n: _attr(s, "otelprof.memory.oom_count") for n, s in steps.items()}
    print(json.dumps({"step_peaks": peaks, "script_peaks": measured, "run_peak": run_peak, "ooms": ooms}, indent=1))
    if sorted(steps) != list(range(7)) or any(v is None for v in peaks.values()):
        fail(f"steps {sorted(steps)}: each of 0-6 needs its CUDA peak ({peaks})")
    if any(reserved[n] is None or reserved[n].int_value < peaks[n] for n in steps):
        fail("a step's reserved peak is missing or below its allocated peak")
    if run_peak < 1 << 30 or run_peak != max(peaks[n] for n in (0, 1, 2)):
        fail(f"max_memory_allocated() after steps 0-2 is {run_peak}, their step peaks {peaks}")
    for n, value in measured.items():
        if peaks[n] != value:
            fail(f"step {n}: span peak {peaks[n]} != the script's max_memory_allocated() {value}")
    if caught != 1 or ooms != 1 or marked[6] is None or marked[6].int_value != 1:
        fail(f"a caught CUDA OOM: caught {caught}, otelprof_oom_total {ooms}, step 6 marked {marked[6]}")
    print("OK: per-step CUDA peaks equal the script's, the shim keeps the run's peak, a caught OOM counted")


_OOM_CHILD = """
import torch, otelprof
otelprof.instrument()
torch.cuda.memory._record_memory_history(max_entries=10000)
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(4):
    x = torch.randn(64, 1024, device="cuda")
    if i == 3:
        x = torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def check_uncaught_oom() -> None:
    """A CUDA OOM that ends the process, memory history on: the failed step is spooled with error
    status, the exception event (allocator figures and summary) and the snapshot's file."""
    import os
    import pickle
    import subprocess

    folder = Path(tempfile.mkdtemp(prefix="otelprof-gpu-oom-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(
        OTELPROF_SPOOL_DIR=str(folder / "spool"),
        OTELPROF_TRACE_DIR=str(folder / "traces"),
        OTELPROF_RUN_ID="gpu-oom",
        OTELPROF_PROFILE="false",
        OTEL_METRICS_EXPORTER="none",
        OTELPROF_OOM_WAIT="5",
    )
    done = subprocess.run([sys.executable, "-c", _OOM_CHILD], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 1 or "OutOfMemoryError" not in done.stderr:
        fail(f"the OOM child exited {done.returncode}: {done.stderr[-2000:]}")
    steps = _spooled_steps(folder / "spool")
    failed = steps.get(3)
    if sorted(steps) != [0, 1, 2, 3] or failed is None or failed.status.code != 2:  # STATUS_CODE_ERROR
        fail(f"steps {sorted(steps)}; step 3's status {failed and failed.status}")
    assert failed is not None
    event = failed.events[0] if failed.events else None
    if event is None or event.name != "exception":
        fail("the failed step has no exception event")
    assert event is not None
    kind = _attr(event, "exception.type")
    summary = _attr(event, "otelprof.memory.summary")
    if kind is None or kind.string_value != "torch.OutOfMemoryError" or summary is None:
        fail(f"exception.type {kind}; memory summary {'present' if summary else 'missing'}")
    marked = _attr(failed, "otelprof.memory.oom_count")
    if marked is None or marked.int_value != 1:
        fail(f"the failed step's oom_count is {marked}")
    snapshot = _attr(failed, "otelprof.memory.snapshot.file")
    if snapshot is None or not Path(snapshot.string_value).is_file():
        fail(f"no memory snapshot file ({snapshot})")
    assert snapshot is not None
    with open(snapshot.string_value, "rb") as f:
        data = pickle.load(f)
    if not data.get("segments"):
        fail("the memory snapshot has no segments")
    print(f"OK: an uncaught CUDA OOM spooled as a failed step, snapshot {snapshot.string_value}")


if __name__ == "__main__":
    sys.exit(main())
