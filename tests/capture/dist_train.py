"""A two-rank gloo training job run by the distributed tests.

    python dist_train.py OUT_DIR STEPS torchrun      # under torchrun (env://), a DDP model
    python dist_train.py OUT_DIR STEPS spawn PORT    # torch.multiprocessing.spawn, tcp:// init,
                                                     # no launcher env; rank 1 sleeps every step
    python dist_train.py OUT_DIR STEPS mismatch PORT # the same, otelprof disabled on rank 1

In torchrun mode the process is instrumented by whatever launched it (``otelprof run``); in spawn
mode each worker imports ``otelprof.auto``. After training, each rank waits (bounded) until its
straggler exchanges are all read, then scrapes its own /metrics (OpenMetrics) into
OUT_DIR/metrics-RANK.txt for the test to parse.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def train(out: Path, steps: int, ddp: bool, slow_rank: int | None) -> None:
    import otelprof

    rank = dist.get_rank()
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 4 * dist.get_world_size(), 16))
    sampler: torch.utils.data.DistributedSampler[Any] = torch.utils.data.DistributedSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (batch,) in loader:
        model(batch).pow(2).mean().backward()
        if rank == slow_rank:
            time.sleep(0.03)
        opt.step()
        opt.zero_grad()
    dist.barrier()

    session = otelprof.instrumentation.session()
    if session is None or session.straggler is None:
        print(f"rank {rank} trained {steps} without straggler metric", flush=True)
        return
    exchanges = steps // session.straggler.interval
    deadline = time.monotonic() + 60
    while session.straggler.completed < exchanges and time.monotonic() < deadline:
        session.straggler.poll()
        time.sleep(0.01)
    request = urllib.request.Request(
        f"http://127.0.0.1:{session.metrics_port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    (out / f"metrics-{rank}.txt").write_text(text)
    print(f"rank {rank} trained {steps}", flush=True)


def spawned(local_rank: int, out: Path, steps: int, port: int, mismatch: bool) -> None:
    import os

    if mismatch:
        if local_rank == 1:
            os.environ["OTELPROF_ENABLED"] = "false"
        from otelprof.capture.distributed import ranks as distributed

        distributed.TIMEOUT_S = 3.0  # rank 0 waits this long for rank 1 at the first step

    import otelprof.auto  # noqa: F401  (the one-line integration, in each worker)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=2)
    try:
        train(out, steps, ddp=False, slow_rank=1)
    finally:
        dist.destroy_process_group()


def main() -> None:
    out, steps, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if mode in ("spawn", "mismatch"):
        torch.multiprocessing.spawn(spawned, args=(out, steps, int(sys.argv[4]), mode == "mismatch"), nprocs=2)
        return
    dist.init_process_group("gloo")
    try:
        train(out, steps, ddp=True, slow_rank=None)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
