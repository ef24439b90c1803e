"""A Hugging Face Trainer script with no otelprof in it, run under ``otelprof run`` by
test_transformers.py: a tiny GPT-2 from a config, 4 updates of 2 micro-batches of 4, an
evaluation every 2 updates."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import torch
import transformers

SEQ = 16


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, SEQ), generator=torch.Generator().manual_seed(n))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, n_positions=SEQ, vocab_size=64, bos_token_id=0, eos_token_id=0
    )
    args = transformers.TrainingArguments(
        output_dir=os.environ["HF_OUTPUT_DIR"],
        run_name="hf-under-otelprof-run",
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=Tokens(32),
        eval_dataset=Tokens(8),
        data_collator=transformers.default_data_collator,
    )
    trainer.train()
    print("trained", trainer.state.global_step)


if __name__ == "__main__":
    main()
