"""Hugging Face ``Trainer`` under ``otelprof.instrument()``, as a user runs it: a tiny GPT-2 built
from a config (no hub download), gradient accumulation 1 and 4, an evaluation every 10 steps.
The callback is added by otelprof itself; the loop's own counts come from a Trainer subclass
and a callback of the test's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # never a hub download, whatever the test machine can reach
pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
import transformers

from integrations import checks
from otelprof.integrations.transformers import OtelprofCallback

STEPS = 30
BATCH = 4
SEQ = 16
VOCAB = 64
EVAL_EVERY = 10
EVAL_SAMPLES = 8
TOKENS = {"bos_token_id": 0, "eos_token_id": 0}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class CountingTrainer(transformers.Trainer):
    """The truth: what each ``training_step`` gets (a user's override, kept by otelprof)."""

    truth: checks.Truth
    pending: list[int]

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        self.pending.append(inputs["input_ids"].shape[0])
        return super().training_step(model, inputs, num_items_in_batch)


class Truth(transformers.TrainerCallback):
    def __init__(self, trainer: CountingTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        pending, self.trainer.pending = self.trainer.pending, []
        self.trainer.truth.samples.append(sum(pending))
        self.trainer.truth.tokens.append(sum(pending) * SEQ)
        self.trainer.truth.micro_batches.append(len(pending))

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.truth.evaluations += 1
        self.trainer.truth.evaluated_after.append(len(self.trainer.truth.samples))


def _train(accumulation: int, out: Path) -> tuple[CountingTrainer, checks.Truth]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=SEQ, vocab_size=VOCAB, **TOKENS)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        run_name=f"hf-accum-{accumulation}",
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=accumulation,
        max_steps=STEPS,
        eval_strategy="steps",
        eval_steps=EVAL_EVERY,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = CountingTrainer(
        model=model,
        args=args,
        train_dataset=Tokens(STEPS * BATCH * accumulation, seed=1),
        eval_dataset=Tokens(EVAL_SAMPLES, seed=2),
        data_collator=transformers.default_data_collator,
    )
    trainer.truth, trainer.pending = checks.Truth(), []
    trainer.add_callback(Truth(trainer))
    trainer.train()
    return trainer, trainer.truth


@pytest.fixture(
    scope="module",
    params=[pytest.param(1, id="accumulation-1"), pytest.param(4, id="accumulation-4", marks=pytest.mark.slow)],
)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[checks.Captured, Any]:
    tmp = tmp_path_factory.mktemp("hf")
    with checks.instrumented(tmp / "spool") as (_session, captured):
        trainer, truth = _train(request.param, tmp / "out")
        callbacks = [c for c in trainer.callback_handler.callbacks if isinstance(c, OtelprofCallback)]
        assert len(callbacks) == 1, "otelprof did not add its callback (once) to the Trainer"
    assert trainer.state.global_step == STEPS
    assert truth.micro_batches == [request.param] * STEPS
    return captured[0], (truth, request.param)


def test_one_step_per_update_with_its_samples_and_tokens(run: tuple[checks.Captured, Any]) -> None:
    captured, (truth, accumulation) = run
    checks.check_steps(captured, truth)
    assert sum(truth.samples) == STEPS * BATCH * accumulation  # 480 with accumulation 4
    # the run id is the Trainer's run name
    assert captured.resource["otelprof.run.id"] == f"hf-accum-{accumulation}"
    labels = {s.labels["run"] for s in captured.metrics["otelprof_steps"].samples}
    assert labels == {f"hf-accum-{accumulation}"}


def test_phases_inside_their_step_without_overlap(run: tuple[checks.Captured, Any]) -> None:
    captured, (_truth, accumulation) = run
    steps = captured.named("train.step")
    checks.check_phases(captured, steps)
    for step in steps:  # every micro-batch's forward and backward is in its update's step
        names = [checks.phase_of(p) for p in checks.phase_spans(captured, step)]
        assert names.count("forward") == accumulation and names.count("backward") == accumulation


def test_evaluation_is_its_own_span(run: tuple[checks.Captured, Any]) -> None:
    captured, (truth, _accumulation) = run
    assert truth.evaluations == STEPS // EVAL_EVERY
    checks.check_evaluations(captured, truth, captured.named("train.step"))


def test_metrics_count_the_training_steps_alone(run: tuple[checks.Captured, Any]) -> None:
    captured, (truth, _accumulation) = run
    checks.check_metrics(captured, truth)
    steps = captured.named("train.step")  # numbered 0..29: an evaluation takes no step number
    assert [checks.attrs(s)["otelprof.step.number"] for s in steps] == list(range(STEPS))


def test_micro_batches_per_step(run: tuple[checks.Captured, Any]) -> None:
    captured, (truth, _accumulation) = run
    checks.check_micro_batches(captured, truth)


def test_by_hand_and_after_uninstrument(tmp_path: Path) -> None:
    """A callback the user added is the one used (no second); after ``uninstrument()`` a new
    Trainer gets none, and the class is as it was."""
    init = transformers.Trainer.__init__
    with checks.instrumented(tmp_path / "spool", scrape_metrics=False):
        assert transformers.Trainer.__init__ is not init
        config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=SEQ, vocab_size=VOCAB, **TOKENS)
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)
        mine = OtelprofCallback()
        trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, callbacks=[mine])
        ours = [c for c in trainer.callback_handler.callbacks if isinstance(c, OtelprofCallback)]
        assert ours == [mine]
    assert transformers.Trainer.__init__ is init
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args)
    assert not [c for c in trainer.callback_handler.callbacks if isinstance(c, OtelprofCallback)]


@pytest.mark.slow  # a subprocess that imports transformers and trains
def test_under_otelprof_run_with_no_code_change(tmp_path: Path) -> None:
    """``otelprof run -- python hf_train.py``: the bootstrap instruments at ``import torch``
    (inside ``import transformers``), the callback goes into the Trainer the script builds."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otelprof.export.spool import Spool

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        OTELPROF_SPOOL_DIR=str(tmp_path / "spool"),
        OTEL_EXPORTER_PROMETHEUS_PORT="0",
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTELPROF_PROFILE="false",
        HF_OUTPUT_DIR=str(tmp_path / "out"),
    )
    script = str(Path(__file__).with_name("hf_train.py"))
    command = [sys.executable, "-m", "otelprof", "run", "--", sys.executable, script]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split()[-2:] == ["trained", "4"]
    spans = [
        span
        for _path, data in Spool(tmp_path / "spool")
        for rs in ExportTraceServiceRequest.FromString(data).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    steps = sorted((s for s in spans if s.name == "train.step"), key=lambda s: s.start_time_unix_nano)
    assert [checks.attrs(s)["otelprof.step.number"] for s in steps] == [0, 1, 2, 3]
    assert [checks.attrs(s)["otelprof.step.samples"] for s in steps] == [8] * 4
    assert [checks.attrs(s)["otelprof.step.tokens"] for s in steps] == [8 * SEQ] * 4
    # an evaluation every 2 updates: numbered by the updates done before it, as the steps are
    evaluations = sorted((s for s in spans if s.name == "evaluation"), key=lambda s: s.start_time_unix_nano)
    assert [checks.attrs(s)["otelprof.step.number"] for s in evaluations] == [2, 4]
