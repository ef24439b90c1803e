"""What FLOPs counting costs a profiled window (issue 37), on CPU loops, ABBA-interleaved:

1. torch's own: a recorded step under bare ``torch.profiler`` (``_KinetoProfile``, CPU
   activity) with ``with_flops`` against the same without it, over the same step unprofiled
   (what ``OTELPROF_PROFILE_OPTIONS=with_flops`` adds to each recorded step: torch records
   shapes and computes the FLOPs; otelprof adds nothing on the training thread).
2. otelprof's own: ``window_flops`` reading torch's results on the conversion thread, against
   the window's conversion (save + native convert) that it runs beside.

    python benchmarks/flops_window.py [--rounds N] [--steps N]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity
from torch.profiler.profiler import _KinetoProfile

from otelprof import convert
from otelprof.capture.metrics.mfu import window_flops

#: (name, m, [layer widths]): the test's MLP (tests/capture/mfu_loop.py) and a wider, deeper one
LOOPS = (("mlp-test", 16, [32, 64, 8]), ("mlp-wide", 256, [1024, 1024, 1024, 1024, 1024]))


def make_step(m: int, widths: list[int]) -> Any:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(m, widths[0])

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    return step


def profiled(step: Any, steps: int, flops: bool) -> tuple[float, Any]:
    """Mean seconds per recorded step, and torch's profile."""
    prof = _KinetoProfile(activities=[ProfilerActivity.CPU], with_flops=flops)
    prof.prepare_trace()
    step()  # the warmup step
    prof.start_trace()
    start = time.perf_counter()
    for n in range(steps):
        with torch.profiler.record_function(f"ProfilerStep#{n}"):
            step()
    seconds = (time.perf_counter() - start) / steps
    prof.stop_trace()
    return seconds, prof


def bare(step: Any, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {args.rounds} rounds of {args.steps} recorded steps (median)")
    for name, m, widths in LOOPS:
        step = make_step(m, widths)
        for _ in range(3):
            step()
        times: dict[str, list[float]] = {"bare": [], "window": [], "window+flops": []}
        reading: list[float] = []
        per_step = 0.0
        converting: list[float] = []
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for flops in order:
                seconds, prof = profiled(step, args.steps, flops)
                times["window+flops" if flops else "window"].append(seconds)
                if flops:
                    t = time.perf_counter()
                    counted = window_flops(prof.profiler.kineto_results)
                    reading.append(time.perf_counter() - t)
                    assert counted is not None and counted.steps == args.steps
                    per_step = counted.flops_per_step
                    with tempfile.TemporaryDirectory() as tmp:
                        path = Path(tmp) / "w.json"
                        t = time.perf_counter()
                        prof.export_chrome_trace(str(path))
                        convert(path)
                        converting.append(time.perf_counter() - t)
            times["bare"].append(bare(step, args.steps))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{name}: step bare {med['bare'] * 1e3:.3f} ms; recorded {med['window'] * 1e3:.3f} ms "
            f"({med['window'] / med['bare']:.2f}x), with_flops {med['window+flops'] * 1e3:.3f} ms "
            f"({med['window+flops'] / med['bare']:.2f}x bare, {med['window+flops'] / med['window']:.3f}x the window "
            f"without); window_flops {statistics.median(reading) * 1e3:.2f} ms per window vs its save+convert "
            f"{statistics.median(converting) * 1e3:.1f} ms; FLOPs/step {per_step:.4g}"
        )


if __name__ == "__main__":
    main()
