"""A tiny training loop compiled by inductor in the ways tests/capture/test_compile.py compares
with and without otelprof, CASES in order, STEPS steps each, each case on a cold inductor cache
of its own (a fresh TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, under the TORCHINDUCTOR_CACHE_DIR
it starts with or a new temporary folder; torch's in-memory caches cleared): what a first run on a
machine does. Prints one JSON line: per case, torch._dynamo's counters, the losses and the final
weights.

Usage: compile_cases.py (run plain, or under ``otelprof run``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

STEPS = 3
BATCH = 4
#: case: (torch.compile's keywords, what it compiles: the model, a function calling it (forward
#: and loss) or the optimizer's step)
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "reduce-overhead": ({"mode": "reduce-overhead"}, "model"),
    "max-autotune-no-cudagraphs": ({"mode": "max-autotune-no-cudagraphs"}, "model"),
    "fullgraph": ({"fullgraph": True}, "forward"),  # otelprof's forward hooks inside the graph
    "optimizer": ({}, "optimizer"),  # its step hooks inside the graph
}


def _case(kwargs: dict[str, Any], compiled: str) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS * BATCH, 8), torch.randint(0, 4, (STEPS * BATCH,)))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    forward = torch.compile(model, **kwargs) if compiled == "model" else model

    def loss_of(x: Any, y: Any) -> Any:
        return loss_fn(forward(x), y)

    if compiled == "forward":
        loss_of = torch.compile(loss_of, **kwargs)
    step = torch.compile(opt.step, **kwargs) if compiled == "optimizer" else opt.step
    losses = []
    for x, y in loader:
        loss = loss_of(x, y)
        loss.backward()
        step()
        opt.zero_grad()
        losses.append(loss.item())
    return {
        "counters": {k: dict(v) for k, v in sorted(counters.items()) if v},  # an empty table is none
        "losses": losses,
        "weights": [p.detach().flatten().tolist() for p in model.parameters()],
    }


def main() -> None:
    root = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or tempfile.mkdtemp())
    out = {}
    for name, (kwargs, compiled) in CASES.items():
        cache = root / name
        os.environ["TRITON_CACHE_DIR"] = str(cache / "triton")
        with temporary_cache_dir(str(cache)):  # clears torch's in-memory caches too
            out[name] = _case(kwargs, compiled)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
