"""A DataLoader loop that exits without uninstrumenting, its last step or its evaluation
forwards still open: otelprof closes them at interpreter exit, and the OTLP metrics must carry
them. For test_otlp_exit.py. Prints one JSON line, the loop's own counts.

    python otlp_exit_train.py UPDATES EVAL_FORWARDS

EVAL_FORWARDS 0: the loop breaks right after its last update (no fetch ends that step: it
closes at exit). Otherwise the OTLP metrics are exported once after the last update (as a
periodic export would be) and that many ``torch.no_grad()`` forwards (evaluation) follow.
"""

import json
import sys
import time
from typing import Any

import torch

import otelprof


def main() -> None:
    updates, eval_forwards = int(sys.argv[1]), int(sys.argv[2])
    otelprof.instrument()
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data: Any = torch.randn(100 * 4, 6)  # a tensor serves as a dataset
    loader: Any = torch.utils.data.DataLoader(data, batch_size=4)
    last_update = 0.0
    for i, batch in enumerate(loader):
        model(batch).pow(2).mean().backward()
        last_update = time.time()  # the last step ends after this (its optimizer step)
        opt.step()
        opt.zero_grad()
        if i + 1 == updates:
            break
    if eval_forwards:
        session = otelprof.instrumentation.session()
        assert session is not None and session.otlp_metrics is not None
        session.otlp_metrics.provider.force_flush()
        with torch.no_grad():
            for _ in range(eval_forwards):
                model(data[:4])
    print(json.dumps({"updates": updates, "samples": 4 * updates, "last_update": last_update}), flush=True)


if __name__ == "__main__":
    main()
