"""One rank of a small CPU DistributedDataParallel run (gloo), instrumented by otelprof, for the
live stack test. The test starts one process per rank with torchrun's variables (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and otelprof's.

    python ddp_train.py STEPS

After training it prints "trained" and keeps its /metrics up until its stdin closes, so
Prometheus scrapes the final values; otelprof flushes its last spans at exit.
"""

import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import otelprof

BATCH = 8
SEQ = 16


def main() -> None:
    steps = int(sys.argv[1])
    otelprof.instrument()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    # token ids: otelprof infers samples (batch) and tokens (batch x sequence) from the batch
    tokens: Any = torch.randint(0, 100, (steps * BATCH * world, SEQ))  # a tensor serves as a dataset
    sampler: Any = torch.utils.data.distributed.DistributedSampler(tokens, num_replicas=world, rank=rank, shuffle=False)
    loader: Any = torch.utils.data.DataLoader(tokens, batch_size=BATCH, sampler=sampler)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Embedding(100, 32), torch.nn.Flatten(), torch.nn.Linear(32 * SEQ, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pause = float(os.environ.get("TRAIN_STEP_SLEEP_S", "0"))
    for batch in loader:
        time.sleep(pause * (1 + rank))  # rank 1 works longer than rank 0 before each step
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    print("trained", flush=True)
    sys.stdin.read()
    otelprof.uninstrument()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
