"""The framework loops benchmarks/overhead.py times bare and under otelprof: a Hugging Face
``Trainer`` (tiny GPT-2 from a config, gradient accumulation 2) and a Lightning ``Trainer``
(a tiny token model). Each ``run()`` builds a fresh Trainer (under otelprof it gets the callback
automatically) from the same initial weights and returns seconds per optimizer update over the
run but its first update."""

from __future__ import annotations

import copy
import logging
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

SEQ = 32
VOCAB = 128
BATCH = 8


def _ids(n: int) -> Any:
    return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))


def _per_step(times: list[float]) -> float:
    return (times[-1] - times[0]) / (len(times) - 1)


def hf_loop(steps: int, accumulation: int = 2) -> Callable[[], float]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, ids: Any) -> None:
            self.ids = ids

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class Timer(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.times.append(time.perf_counter())

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, n_positions=SEQ, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    initial = copy.deepcopy(model.state_dict())
    data = Tokens(_ids(steps * accumulation * BATCH))
    out = tempfile.mkdtemp(prefix="otelprof-bench-hf-")
    args = transformers.TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accumulation,
        max_steps=steps,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )

    def run() -> float:
        model.load_state_dict(initial)
        timer = Timer()
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=data, data_collator=transformers.default_data_collator
        )
        trainer.add_callback(timer)
        trainer.remove_callback(transformers.PrinterCallback)  # its log line per run
        trainer.train()
        return _per_step(timer.times)

    return run


def lightning_loop(steps: int) -> Callable[[], float]:
    import lightning.pytorch as L

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # "GPU available: False" per Trainer

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
            self.net = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.TransformerEncoder(layer, 2))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_end(self, *args: Any) -> None:
            self.times.append(time.perf_counter())

    torch.manual_seed(0)
    module = Tiny()
    initial = copy.deepcopy(module.state_dict())
    data = torch.utils.data.TensorDataset(_ids(steps * BATCH))

    def run() -> float:
        module.load_state_dict(initial)
        timer = Timer()
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=steps,
            callbacks=[timer],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=BATCH))
        return _per_step(timer.times)

    return run
