"""A Composer training run, started by test_composer.py in its own environment (mosaicml
0.32.1 installed with --no-deps beside torch 2.13; see there). Prints one JSON line: the loop's
own counts and the /metrics scrape taken before ``uninstrument()``.

    python composer_train.py BATCHES EVAL_EVERY
"""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any

import torch
from composer import Callback, Trainer
from composer.models import ComposerClassifier

import otelprof
from otelprof.capture.steps.hooks import batch_size
from otelprof.integrations.composer import OtelprofCallback


class Truth(Callback):
    def __init__(self) -> None:
        self.samples: list[int] = []
        self.micro_batches: list[int] = []
        self.evaluations = 0
        self.evaluated_after: list[int] = []  # batches (updates) done before each evaluation
        self._micro = 0
        self._samples = 0

    def after_dataloader(self, state: Any, logger: Any) -> None:
        self._samples = int(state.batch[0].shape[0])
        self._micro = 0

    def before_forward(self, state: Any, logger: Any) -> None:
        self._micro += 1

    def batch_end(self, state: Any, logger: Any) -> None:
        self.samples.append(self._samples)
        self.micro_batches.append(self._micro)

    def eval_start(self, state: Any, logger: Any) -> None:
        self.evaluations += 1
        self.evaluated_after.append(len(self.samples))


def main() -> None:
    batches, eval_every = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    x, y = torch.randn(batches * 4, 8), torch.randint(0, 3, (batches * 4,))
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    evaluation = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:8], y[:8]), batch_size=4)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model = ComposerClassifier(module, num_classes=3)
    session = otelprof.instrument()
    assert session is not None
    truth = Truth()
    trainer = Trainer(
        model=model,
        train_dataloader=train,
        eval_dataloader=evaluation,
        max_duration=f"{batches}ba",
        eval_interval=f"{eval_every}ba",
        callbacks=[truth, OtelprofCallback()],
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        device="cpu",
        device_train_microbatch_size=2,
        run_name="composer-run",
        loggers=[],
        progress_bar=False,
        log_to_console=False,
    )
    trainer.fit()
    url = f"http://127.0.0.1:{session.metrics_port}/metrics"
    request = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    metrics = urllib.request.urlopen(request, timeout=10).read().decode()
    otelprof.uninstrument()
    assert batch_size([x[:4], y[:4]]) == (4, None)
    out = {
        "batches": int(trainer.state.timestamp.batch),
        "samples": truth.samples,
        "micro_batches": truth.micro_batches,
        "evaluations": truth.evaluations,
        "evaluated_after": truth.evaluated_after,
        "metrics": metrics,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
