"""The live path on a real GPU: run where CUDA is (the device tool), never in CI.

    python benchmarks/gpu_check.py [--steps N]

A small CUDA transformer trains under ``otelprof.instrument()`` with a profiling window at
steps 4-5, exporting to a spool folder; the script then decodes every request and checks:

- one ``train.step`` span per step, timed by CUDA events (no CPU fallback after the first
  step), each step's device duration within the CPU-measured loop time of the run;
- the window's kernel spans (``otelprof.event.category`` = ``kernel``) sit under the runtime
  call that launched them (``cudaLaunchKernel`` and friends), which sits under an ``aten::`` op,
  all in the profiled step's trace;
- the window metrics name kernels and report a GPU busy share in (0, 1].

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
