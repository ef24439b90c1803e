"""A DataLoader loop that stops before the epoch ends (its last step is still open) and exits
without uninstrumenting: otelprof closes that step at interpreter shutdown. For
test_step_loops.py::test_the_last_step_is_scrapeable_during_the_shutdown_flush.

    python exit_train.py UPDATES
"""

import sys
from typing import Any

import torch

import otelprof


def main() -> None:
    updates = int(sys.argv[1])
    otelprof.instrument()
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data: Any = torch.randn(100 * 4, 6)  # a tensor serves as a dataset
    loader: Any = torch.utils.data.DataLoader(data, batch_size=4)
    for i, batch in enumerate(loader):
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if i + 1 == updates:
            break  # no fetch after the last update: its step ends at shutdown


if __name__ == "__main__":
    main()
