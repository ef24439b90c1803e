"""The step rules on real libraries' loops under a live session (issue 32): activation
checkpointing, GradScaler's skipped updates, an EMA teacher with evaluation between updates,
``step_scope`` over a DataLoader, accelerate's ``accumulate()`` and a Hugging Face Trainer with
gradient checkpointing. Each loop counts its own truth, checked against the decoded step spans
at a real OTLP receiver and a /metrics scrape taken while the process runs."""

from __future__ import annotations

import copy
import inspect
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from export.receivers import HttpReceiver, http_receiver
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

import otelprof
from capture import live_session
from capture.test_step_loops import _attrs, _check_phases, _module, _names, _scrape, _start, _steps

torch = pytest.importorskip("torch")

BATCH = 4


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


def _skipped(span: PbSpan) -> bool:
    return any(kv.key == "otelprof.step.skipped" and kv.value.bool_value for kv in span.attributes)


def _roots(session: Any) -> list[str]:
    forward = session.hooks.forward
    return sorted(type(m).__name__ for m in forward.roots()) if forward is not None else []


# --- activation checkpointing ------------------------------------------------------------------


_Module: Any = torch.nn.Module


class Checkpointed(_Module):
    """Three checkpointed blocks: their forwards run again inside backward."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inp = torch.nn.Linear(6, 16)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()) for _ in range(3)
        )
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        x = self.inp(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_recomputation_is_backward(receiver: HttpReceiver, tmp_path: Path, reentrant: bool) -> None:
    """torch.utils.checkpoint (both modes): one forward phase per model call, the recomputed
    blocks inside backward; the blocks are never roots, and nothing counts as evaluation."""
    updates = 8
    session = _start(receiver, tmp_path)
    torch.manual_seed(0)
    model = Checkpointed(reentrant)
    recomputed = [0]  # the truth: block forwards run inside backward

    def count(_module: Any, _input: Any) -> None:
        recomputed[0] += torch._C._current_graph_task_id() != -1

    for block in model.blocks:
        block.register_forward_pre_hook(count)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.randn(updates * BATCH, 6), batch_size=BATCH)
    for batch in loader:
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    scraped = _scrape(session)
    roots = _roots(session)
    live_session.stop(session)
    assert recomputed[0] == updates * 3
    assert scraped["otelprof_steps_total"] == updates and scraped["otelprof_eval_forwards_total"] == 0
    assert roots == ["Checkpointed"]
    steps = _steps(receiver)
    assert len(steps) == updates
    for step, phases in steps:
        _check_phases(step, phases)
        assert _names(phases) == ["data", "forward", "backward", "optimizer"]
        assert [_module(p) for p in phases if p.name.startswith("forward")] == ["Checkpointed"]


# --- skipped updates ---------------------------------------------------------------------------


def test_skipped_updates_are_steps_that_say_so(receiver: HttpReceiver, tmp_path: Path) -> None:
    """torch.amp.GradScaler on the CPU, inf gradients forced in 4 of 24 iterations: 24 steps of
    one micro-batch each, the 4 skipped ones marked and counted."""
    iterations, forced = 24, {3, 4, 11, 20}
    session = _start(receiver, tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    loader = torch.utils.data.DataLoader(torch.randn(iterations * BATCH, 6), batch_size=BATCH)
    skipped: list[bool] = []  # the truth: the scale backs off when the update was skipped
    for i, batch in enumerate(loader):
        scaler.scale(model(batch).pow(2).mean()).backward()
        if i in forced:
            assert model.weight.grad is not None
            model.weight.grad.mul_(float("inf"))
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < before)
        opt.zero_grad()
    scraped = _scrape(session)
    live_session.stop(session)
    assert [i for i, s in enumerate(skipped) if s] == sorted(forced)
    assert scraped["otelprof_steps_total"] == iterations
    assert scraped["otelprof_skipped_updates_total"] == len(forced)
    assert scraped["otelprof_micro_batches_total"] == iterations
    steps = _steps(receiver)
    assert [_skipped(s) for s, _p in steps] == skipped
    for step, phases in steps:
        _check_phases(step, phases)
        assert _attrs(step)["otelprof.step.micro_batches"] == 1 and _attrs(step)["otelprof.step.samples"] == BATCH
        assert _names(phases) == ["data", "forward", "backward", "optimizer"]


# --- an EMA teacher and evaluation --------------------------------------------------------------


def test_an_ema_teachers_forward_is_the_steps_own(receiver: HttpReceiver, tmp_path: Path) -> None:
    """A no-grad teacher forward after each update belongs to its step; evaluation on held-out
    tensors every 4 updates, a validation DataLoader once, and an evaluation without a
    DataLoader at the end are evaluation."""
    updates = 12
    session = _start(receiver, tmp_path)
    torch.manual_seed(0)
    student = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    teacher = copy.deepcopy(student).requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), lr=0.01)
    train = torch.utils.data.DataLoader(torch.randn(updates * BATCH, 6), batch_size=BATCH)
    held_out = torch.randn(3 * BATCH, 6)
    evaluations = 0  # the truth: forwards that evaluate
    for i, batch in enumerate(train):
        student(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
                t.mul_(0.9).add_(s, alpha=0.1)
            teacher(batch)  # the teacher's targets, for a distillation metric
            if i % 4 == 3:
                student.eval()
                for held in held_out.split(BATCH):
                    student(held)
                    evaluations += 1
                student.train()
            if i == 5:
                for held in torch.utils.data.DataLoader(held_out[: 2 * BATCH], batch_size=BATCH):
                    student(held)
                    evaluations += 1
    with torch.no_grad():  # the end: evaluation without a DataLoader
        for held in held_out.split(BATCH)[:2]:
            student(held)
            evaluations += 1
    scraped = _scrape(session)
    live_session.stop(session)
    assert evaluations == 3 * 3 + 2 + 2
    assert scraped["otelprof_eval_forwards_total"] == evaluations
    assert scraped["otelprof_steps_total"] == updates and scraped["otelprof_samples_total"] == updates * BATCH
    steps = _steps(receiver)
    assert len(steps) == updates
    for step, phases in steps:
        _check_phases(step, phases)
        assert _names(phases) == ["data", "forward", "backward", "optimizer", "forward"]


# --- step_scope over a DataLoader ---------------------------------------------------------------


def test_a_scope_takes_the_batch_fetched_before_it(receiver: HttpReceiver, tmp_path: Path) -> None:
    """``for x in loader: with otelprof.step_scope("infer"): model(x)``: each scope has the
    samples of the batch fetched just before it."""
    batches = 6
    session = _start(receiver, tmp_path)
    model = torch.nn.Linear(6, 1)
    loader = torch.utils.data.DataLoader(torch.randn(batches * BATCH - 1, 6), batch_size=BATCH)
    samples = []  # the truth
    with torch.no_grad():
        for x in loader:
            with otelprof.step_scope("infer"):
                model(x)
            samples.append(x.shape[0])
    scraped = _scrape(session)
    live_session.stop(session)
    scopes = sorted((s for s in receiver.spans if s.name == "infer"), key=lambda s: s.start_time_unix_nano)
    assert [_attrs(s)["otelprof.step.samples"] for s in scopes] == samples == [BATCH] * (batches - 1) + [BATCH - 1]
    assert all(_attrs(s)["otelprof.step.micro_batches"] == 1 for s in scopes)
    assert scraped["otelprof_samples_total"] == sum(samples) and scraped["otelprof_eval_forwards_total"] == 0


# --- accelerate and a Hugging Face Trainer ------------------------------------------------------


def test_a_loader_fetching_ahead_charges_each_batch_to_the_step_that_used_it(
    receiver: HttpReceiver, tmp_path: Path
) -> None:
    """A DataLoader subclass (defined after instrumenting) whose generator ``__iter__`` fetches
    one batch ahead, as accelerate's does: the batches are counted as it yields them; after
    uninstrument() the class and DataLoader are as they were."""
    session = _start(receiver, tmp_path)
    loader: Any = torch.utils.data.DataLoader

    class Ahead(loader):
        def __iter__(self) -> Any:
            it = super().__iter__()
            current = next(it, None)
            for following in it:
                yield current
                current = following
            if current is not None:
                yield current

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    truth, pending = [], 0  # micro-batches per update: 3 per update, 2 in the last
    for i, batch in enumerate(Ahead(torch.randn(11 * BATCH, 6), batch_size=BATCH)):
        model(batch).pow(2).mean().backward()
        pending += 1
        if i % 3 == 2 or i == 10:
            opt.step()
            opt.zero_grad()
            truth.append(pending)
            pending = 0
    scraped = _scrape(session)
    live_session.stop(session)
    assert truth == [3, 3, 3, 2]
    assert scraped["otelprof_steps_total"] == len(truth) and scraped["otelprof_micro_batches_total"] == 11
    steps = _steps(receiver)
    assert [_attrs(s)["otelprof.step.micro_batches"] for s, _p in steps] == truth
    assert [_attrs(s)["otelprof.step.samples"] for s, _p in steps] == [n * BATCH for n in truth]
    assert "__init_subclass__" not in torch.utils.data.DataLoader.__dict__
    assert not getattr(Ahead.__dict__["__iter__"], "_otelprof_outer", False)


@pytest.mark.slow  # imports accelerate
def test_accelerate_accumulate_charges_batches_to_the_step_that_used_them(
    receiver: HttpReceiver, tmp_path: Path
) -> None:
    """accelerate's DataLoaderShard fetches one batch ahead: each step has the micro-batches
    its own updates consumed (4, and the 2 of the last, partial, window)."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState  # type: ignore[import-untyped]

    session = _start(receiver, tmp_path)
    try:
        torch.manual_seed(0)
        accelerator = accelerate.Accelerator(gradient_accumulation_steps=4, cpu=True)
        model = torch.nn.Linear(6, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(torch.randn(22 * BATCH, 6), batch_size=BATCH)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        truth, pending = [], 0  # micro-batches per update
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(batch).pow(2).mean())
                opt.step()
                opt.zero_grad()
                pending += 1
                if accelerator.sync_gradients:
                    truth.append(pending)
                    pending = 0
        scraped = _scrape(session)
    finally:
        live_session.stop(session)
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert truth == [4, 4, 4, 4, 4, 2]
    assert scraped["otelprof_steps_total"] == len(truth) and scraped["otelprof_micro_batches_total"] == 22
    steps = _steps(receiver)
    assert [_attrs(s)["otelprof.step.micro_batches"] for s, _p in steps] == truth
    assert [_attrs(s)["otelprof.step.samples"] for s, _p in steps] == [n * BATCH for n in truth]
    for step, phases in steps:
        _check_phases(step, phases)
        assert _names(phases).count("forward") == _attrs(step)["otelprof.step.micro_batches"]


@pytest.mark.slow  # imports transformers
def test_hf_gradient_checkpointing_with_long_accumulation(
    receiver: HttpReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Trainer over a tiny Llama with gradient checkpointing and 16 micro-batches per update:
    no hint that nothing marks steps, the hooks stay on the model (not its recomputed layers),
    and each step has its 16 forwards, all of the model."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    accumulation, updates, seq = 16, 2, 16
    has_activation_checkpointing = (
        "activation_checkpointing" in inspect.signature(transformers.TrainingArguments).parameters
    )
    session = _start(receiver, tmp_path)
    try:
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=seq,
        )
        ids = torch.randint(0, 64, (updates * accumulation * 2, seq))
        data = [{"input_ids": row, "labels": row} for row in ids]
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=2,
            gradient_accumulation_steps=accumulation,
            # the name transformers 5 deprecates, where it has its successor
            **(
                {"activation_checkpointing": True} if has_activation_checkpointing else {"gradient_checkpointing": True}
            ),
            max_steps=updates,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = transformers.Trainer(
            model=transformers.LlamaForCausalLM(config),
            args=args,
            train_dataset=data,
            data_collator=transformers.default_data_collator,
        )
        with caplog.at_level(logging.WARNING):
            trainer.train()
        scraped = _scrape(session)
        roots = _roots(session)
    finally:
        live_session.stop(session)
    assert trainer.state.global_step == updates
    assert not [r for r in caplog.records if "no steps are recorded" in r.getMessage()]
    assert roots == ["LlamaForCausalLM"]
    assert scraped["otelprof_steps_total"] == updates and scraped["otelprof_eval_forwards_total"] == 0
    steps = _steps(receiver)
    assert len(steps) == updates
    for step, phases in steps:
        _check_phases(step, phases)
        forwards = [_module(p) for p in phases if p.name.startswith("forward")]
        assert forwards == ["LlamaForCausalLM"] * accumulation
        assert _names(phases).count("backward") == accumulation
