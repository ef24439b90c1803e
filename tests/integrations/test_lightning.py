"""Lightning under ``otelprof.instrument()``, as a user runs it: a tiny token model, gradient
accumulation 1 and 2, and manual optimization with two optimizers (each stepping once per batch:
``global_step`` advances by 2), a validation loop every 10 updates (and the sanity check before
training). The callback is added by otelprof itself; the loop's own counts come from a callback
of the test's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")

import lightning.pytorch as L
import torch

from integrations import checks
from otelprof.integrations.lightning import OtelprofCallback

#: Lightning's own call of a torch pytree API that torch deprecates: not this test's to fix.
pytestmark = pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning")

STEPS = 30
BATCH = 4
SEQ = 16
VOCAB = 64
EVAL_EVERY = 10
VAL_BATCHES = 2


class Tiny(L.LightningModule):
    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)
        self.automatic_optimization = not manual

    def forward(self, ids: Any) -> Any:
        return self.head(self.embed(ids))

    def _loss(self, batch: Any) -> Any:
        (ids,) = batch
        return torch.nn.functional.cross_entropy(self(ids).flatten(0, 1), ids.flatten())

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.automatic_optimization:
            return self._loss(batch)
        optimizers = self.optimizers()  # one update: each optimizer steps once (a GAN's D and G)
        for opt in optimizers:
            opt.zero_grad()
        loss = self._loss(batch)
        self.manual_backward(loss)
        for opt in optimizers:
            opt.step()
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return self._loss(batch)

    def configure_optimizers(self) -> Any:
        if self.automatic_optimization:
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return [torch.optim.SGD(self.embed.parameters(), lr=0.1), torch.optim.SGD(self.head.parameters(), lr=0.1)]


class Truth(L.Callback):
    def __init__(self) -> None:
        self.truth = checks.Truth()
        self.pending: list[int] = []
        self.global_step = 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self.pending:
            self.global_step = trainer.global_step
        self.pending.append(batch[0].shape[0])

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self.global_step:
            self.truth.samples.append(sum(self.pending))
            self.truth.tokens.append(sum(self.pending) * SEQ)
            self.truth.micro_batches.append(len(self.pending))
            self.pending = []

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.truth.evaluations += 1
        self.truth.evaluated_after.append(len(self.truth.samples))


def _loader(n: int, seed: int) -> Any:
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=BATCH)


def _train(accumulation: int, manual: bool = False) -> tuple[Any, checks.Truth]:
    torch.manual_seed(0)
    truth = Truth()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        accumulate_grad_batches=accumulation,
        val_check_interval=EVAL_EVERY * accumulation,  # counted in batches
        limit_val_batches=VAL_BATCHES,
        num_sanity_val_steps=VAL_BATCHES,
        callbacks=[truth],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(manual), _loader(STEPS * accumulation * BATCH, 1), _loader(VAL_BATCHES * BATCH, 2))
    return trainer, truth.truth


@pytest.fixture(
    scope="module",
    params=[(1, False), (2, False), (1, True)],
    ids=["accumulation-1", "accumulation-2", "manual-2-optimizers"],
)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[checks.Captured, Any]:
    accumulation, manual = request.param
    run_id = "pl-manual" if manual else f"pl-accum-{accumulation}"
    tmp = tmp_path_factory.mktemp("lightning")
    with checks.instrumented(tmp / "spool", OTELPROF_RUN_ID=run_id) as (_session, captured):
        trainer, truth = _train(accumulation, manual)
        assert len([c for c in trainer.callbacks if isinstance(c, OtelprofCallback)]) == 1
    assert trainer.global_step == STEPS * (2 if manual else 1)  # manual: each optimizer's steps
    assert truth.micro_batches == [accumulation] * STEPS
    return captured[0], (truth, accumulation, run_id)


def test_one_step_per_update_with_its_samples_and_tokens(run: tuple[checks.Captured, Any]) -> None:
    captured, (truth, accumulation, run_id) = run
    checks.check_steps(captured, truth)  # numbered 0..29, with two optimizers too
    assert sum(truth.samples) == STEPS * BATCH * accumulation
    assert captured.resource["otelprof.run.id"] == run_id


def test_every_micro_batch_in_its_update(run: tuple[checks.Captured, Any]) -> None:
    captured, (_truth, accumulation, _run_id) = run
    for step in captured.named("train.step"):
        names = [checks.phase_of(p) for p in checks.phase_spans(captured, step)]
        assert names.count("backward") == accumulation


def test_phases_inside_their_step_without_overlap(run: tuple[checks.Captured, Any]) -> None:
    captured, _ = run
    checks.check_phases(captured, captured.named("train.step"))


def test_validation_is_its_own_span(run: tuple[checks.Captured, Any]) -> None:
    captured, (truth, _accumulation, _run_id) = run
    assert truth.evaluations == 1 + STEPS // EVAL_EVERY  # the sanity check, then every 10 updates
    assert truth.evaluated_after == [0, 10, 20, 30]
    checks.check_evaluations(captured, truth, captured.named("train.step"))


def test_metrics_count_the_training_steps_alone(run: tuple[checks.Captured, Any]) -> None:
    captured, (truth, _accumulation, _run_id) = run
    checks.check_metrics(captured, truth)


def test_micro_batches_per_step(run: tuple[checks.Captured, Any]) -> None:
    captured, (truth, _accumulation, _run_id) = run
    checks.check_micro_batches(captured, truth)


def test_by_hand_and_after_uninstrument(tmp_path: Path) -> None:
    init = L.Trainer.__init__
    with checks.instrumented(tmp_path / "spool", scrape_metrics=False):
        assert L.Trainer.__init__ is not init
        mine = OtelprofCallback()
        trainer = L.Trainer(callbacks=[mine], logger=False, enable_checkpointing=False, enable_progress_bar=False)
        assert [c for c in trainer.callbacks if isinstance(c, OtelprofCallback)] == [mine]
    assert L.Trainer.__init__ is init
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert not [c for c in trainer.callbacks if isinstance(c, OtelprofCallback)]
