"""A Lightning fit that runs until SIGTERM, for test_lightning_sigterm.py.

    python lightning_sigterm_train.py TRUTH_FILE [--auto]

Lightning installs its own SIGTERM handler at fit (composing the one it finds); the test sends
SIGTERM mid-fit, with and without otelprof. TRUTH_FILE holds the trainer's global step after
each batch.
"""

import os
import sys
from typing import Any

if "--auto" in sys.argv:
    import otelprof.auto  # noqa: F401

import lightning.pytorch as L
import torch


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return self.lin(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Truth(L.Callback):
    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(trainer.global_step))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])


def main() -> None:
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(400_000, 8)), batch_size=4)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        callbacks=[Truth()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), data)
    print("fit returned", trainer.global_step, flush=True)


if __name__ == "__main__":
    main()
