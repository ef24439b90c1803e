"""A CPU loop under ``torch.amp.GradScaler`` whose gradients are made infinite in some
iterations, so the scaler skips those updates. For test_otlp_metrics.py.

    python scaler_train.py STEPS SKIP[,SKIP...]
"""

import sys
from typing import Any

import torch

import otelprof.auto  # noqa: F401


def main() -> None:
    steps, skip = int(sys.argv[1]), {int(k) for k in sys.argv[2].split(",")}
    torch.manual_seed(0)
    data: Any = torch.randn(steps * 4, 8)  # a tensor serves as a dataset
    loader: Any = torch.utils.data.DataLoader(data, batch_size=4)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for i, batch in enumerate(loader):
        scaler.scale(model(batch).pow(2).mean()).backward()
        if i in skip:
            grad: Any = model.weight.grad
            grad.fill_(float("inf"))  # the scaler finds inf: it skips this update
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    print("skipped", len(skip), flush=True)


if __name__ == "__main__":
    main()
