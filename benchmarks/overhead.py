"""Always-on overhead: the same CPU training loop with and without otelprof, interleaved.

    python benchmarks/overhead.py [--rounds N] [--steps N]

Each round runs the loop bare and instrumented (``otelprof.instrument()`` ...
``uninstrument()``), alternating which goes first, so drift in machine load hits both
alike; the medians over rounds give the step-time ratio. Target (issue 4): <= 1.005.
(The profiled-window comparison against bare torch.profiler joins it with the windows.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from prometheus_client import CollectorRegistry

import otelprof


def make_loop(steps: int) -> Any:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 64), torch.nn.TransformerEncoder(layer, num_layers=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 100, (8 * steps, 32))

    def run() -> float:
        """Seconds per step over one epoch."""
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=8)
        start = time.perf_counter()
        for (batch,) in loader:
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        return (time.perf_counter() - start) / steps

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40, help="steps per run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = make_loop(args.steps)
    run()  # warm-up
    bare, instrumented = [], []
    with tempfile.TemporaryDirectory() as spool:
        env = {"OTEL_EXPORTER_PROMETHEUS_PORT": "0", "OTELPROF_SPOOL_DIR": spool, "OTELPROF_RUN_ID": "overhead"}
        for round_ in range(args.rounds):
            for with_otelprof in (False, True) if round_ % 2 == 0 else (True, False):  # ABBA order
                if not with_otelprof:
                    bare.append(run())
                    continue
                if otelprof.instrument(environ=env, registry=CollectorRegistry()) is None:
                    raise RuntimeError("otelprof did not instrument")
                instrumented.append(run())
                otelprof.uninstrument()
    b, i = statistics.median(bare), statistics.median(instrumented)
    print(f"bare         : {b * 1e3:.3f} ms/step (median of {args.rounds} runs of {args.steps} steps)")
    print(f"instrumented : {i * 1e3:.3f} ms/step (steps, phases, metrics, step spans)")
    print(f"ratio        : {i / b:.4f} (target <= 1.005: {'met' if i / b <= 1.005 else 'NOT met'})")
    print(json.dumps({"bare_ms": round(b * 1e3, 4), "instrumented_ms": round(i * 1e3, 4), "ratio": round(i / b, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
