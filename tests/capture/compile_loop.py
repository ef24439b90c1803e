"""A tiny training loop twice, compiled two ways, for tests/capture/test_compile.py:
``torch.compile(model)`` and ``torch.compile(train_step)`` (forward, loss and backward inside),
STEPS steps each. Prints one JSON line: per case, torch._dynamo's counters and the losses.

Usage: compile_loop.py BACKEND (run plain, or under ``otelprof run``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from torch._dynamo.utils import counters

STEPS = 4
BATCH = 4


def _case(case: str, backend: str) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    loss_fn = torch.nn.CrossEntropyLoss()  # called at top level: not a second forward phase
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS * BATCH, 8), torch.randint(0, 4, (STEPS * BATCH,)))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    if case == "model":
        compiled = torch.compile(model, backend=backend)

        def train_step(x: Any, y: Any) -> Any:
            loss = loss_fn(compiled(x), y)
            loss.backward()
            return loss

    else:

        @torch.compile(backend=backend)
        def train_step(x: Any, y: Any) -> Any:
            loss = loss_fn(model(x), y)
            loss.backward()  # a graph break of its own (dynamo does not trace backward here)
            return loss

    losses = []
    for x, y in loader:
        losses.append(train_step(x, y).item())
        opt.step()
        opt.zero_grad()
    return {"counters": {k: dict(v) for k, v in sorted(counters.items())}, "losses": losses}


def main() -> None:
    backend = sys.argv[1]
    print(json.dumps({case: _case(case, backend) for case in ("model", "fn")}))


if __name__ == "__main__":
    main()
