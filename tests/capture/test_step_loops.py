"""The step rules on real torch loops under a live session: each loop's own counts (updates,
samples, tokens, micro-batches, evaluation forwards) against the decoded step spans at a real
OTLP receiver and a /metrics scrape taken while the process runs."""

from __future__ import annotations

import itertools
import logging
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from export.receivers import HttpReceiver, http_receiver
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from prometheus_client.parser import text_string_to_metric_families

import otelprof
from capture import live_session
from otelprof.otlp import ids

torch = pytest.importorskip("torch")

RUN = "loops"
PHASE_NAMES = {"data", "forward", "backward", "optimizer"}


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


def _start(rec: HttpReceiver, tmp: Path, **env: str) -> otelprof.instrumentation.Session:
    quiet = {"OTELPROF_TRIGGER_SIGNAL": "none", "OTELPROF_ANOMALY_FACTOR": "0", "OTELPROF_PROFILE": "false"}
    return live_session.start(rec.port, tmp, **{"OTELPROF_RUN_ID": RUN, **quiet, **env})


def _scrape(session: otelprof.instrumentation.Session) -> dict[str, float]:
    """The run's counters from one /metrics scrape: {sample name: value}."""
    url = f"http://127.0.0.1:{session.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.endswith("_total") or s.name.endswith("_count")
        if "phase" not in s.labels
    }


def _attrs(span: PbSpan) -> dict[str, int]:
    return {kv.key: kv.value.int_value for kv in span.attributes if kv.value.HasField("int_value")}


def _steps(rec: HttpReceiver) -> list[tuple[PbSpan, list[PbSpan]]]:
    """Each train.step span (in step order) with its phase spans (in time order)."""
    spans = rec.spans
    steps = sorted((s for s in spans if s.name == "train.step"), key=lambda s: _attrs(s)["otelprof.step.number"])
    out = []
    for step in steps:
        children = [s for s in spans if s.parent_span_id == step.span_id]
        # a profiled step also holds its window's ProfilerStep#N (one root per profiled step)
        profiled = [s for s in children if s.name.startswith("ProfilerStep#")]
        assert len(profiled) <= 1
        phases = sorted((s for s in children if s not in profiled), key=lambda s: s.start_time_unix_nano)
        assert {_phase(p) for p in phases} <= PHASE_NAMES
        out.append((step, phases))
    return out


def _check_phases(step: PbSpan, phases: list[PbSpan]) -> None:
    """Phases lie in their step, never overlap, and sum to at most the step."""
    assert phases
    assert step.start_time_unix_nano <= phases[0].start_time_unix_nano
    assert phases[-1].end_time_unix_nano <= step.end_time_unix_nano
    for before, after in itertools.pairwise(phases):
        assert before.end_time_unix_nano <= after.start_time_unix_nano, (before.name, after.name)
    total = sum(p.end_time_unix_nano - p.start_time_unix_nano for p in phases)
    assert total <= step.end_time_unix_nano - step.start_time_unix_nano


def _names(phases: list[PbSpan]) -> list[str]:
    """The phases (``otelprof.phase.name``); a span's name adds a forward's module: ``forward Linear``."""
    return [_phase(p) for p in phases]


def _phase(span: PbSpan) -> str:
    return next(kv.value.string_value for kv in span.attributes if kv.key == "otelprof.phase.name")


# --- gradient accumulation ---------------------------------------------------------------------

UPDATES, ACCUMULATE, BATCH, SEQ = 6, 4, 4, 8


def _accumulating_loop() -> None:
    """4 micro-batches per optimizer update, GradScaler, bf16 autocast, an LR scheduler."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (UPDATES * ACCUMULATE * BATCH, SEQ))
    loader = torch.utils.data.DataLoader(tokens, batch_size=BATCH)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Flatten(), torch.nn.Linear(16 * SEQ, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    for i, batch in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(batch).float().pow(2).mean() / ACCUMULATE
        scaler.scale(loss).backward()
        if (i + 1) % ACCUMULATE == 0:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scheduler.step()


def test_accumulated_micro_batches_make_one_step(receiver: HttpReceiver, tmp_path: Path) -> None:
    # a profiling window on step 3: its operator spans must lie inside that step
    window = {
        "OTELPROF_PROFILE": "true",
        "OTELPROF_PROFILE_SKIP_FIRST": "2",
        "OTELPROF_PROFILE_WAIT": "0",
        "OTELPROF_PROFILE_WARMUP": "1",
        "OTELPROF_PROFILE_ACTIVE": "1",
        "OTELPROF_PROFILE_REPEAT": "1",
    }
    session = _start(receiver, tmp_path, **window)
    _accumulating_loop()
    scraped = _scrape(session)  # the last step closed at the fetch that ended the epoch
    live_session.stop(session)
    samples, tokens = UPDATES * ACCUMULATE * BATCH, UPDATES * ACCUMULATE * BATCH * SEQ
    assert scraped["otelprof_steps_total"] == UPDATES
    assert scraped["otelprof_samples_total"] == samples
    assert scraped["otelprof_tokens_total"] == tokens
    assert scraped["otelprof_micro_batches_total"] == UPDATES * ACCUMULATE
    assert scraped["otelprof_step_duration_seconds_count"] == UPDATES
    steps = _steps(receiver)
    assert [_attrs(s)["otelprof.step.number"] for s, _p in steps] == list(range(UPDATES))
    for step, phases in steps:
        attrs = _attrs(step)
        assert attrs["otelprof.step.samples"] == ACCUMULATE * BATCH
        assert attrs["otelprof.step.tokens"] == ACCUMULATE * BATCH * SEQ
        assert attrs["otelprof.step.micro_batches"] == ACCUMULATE
        assert _names(phases) == ["data", "forward", "backward"] * ACCUMULATE + ["optimizer"]
        _check_phases(step, phases)
    # the profiled step's operators ran inside it
    profiled = steps[3][0]
    ops = [s for s in receiver.spans if s.trace_id == ids.trace_id(f"step|{RUN}|3") and s.name.startswith("aten::")]
    assert len(ops) > 20
    outside = [s.name for s in ops if not profiled.start_time_unix_nano <= s.start_time_unix_nano]
    outside += [s.name for s in ops if not s.end_time_unix_nano <= profiled.end_time_unix_nano]
    assert outside == []


# --- closures ----------------------------------------------------------------------------------


def test_a_closure_optimizer_phase_is_its_own_time(receiver: HttpReceiver, tmp_path: Path) -> None:
    """LBFGS runs the closure's forward and backward inside optimizer.step(closure) (as
    Lightning's automatic optimization does): they pause the optimizer phase."""
    session = _start(receiver, tmp_path)
    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.randn(5 * 8, 6), batch_size=8)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
    evaluations: list[int] = []
    for batch in data:
        count = [0]

        def closure(batch: Any = batch, count: list[int] = count) -> Any:
            count[0] += 1
            opt.zero_grad()
            loss = model(batch).pow(2).mean()
            loss.backward()
            return loss

        opt.step(closure)
        evaluations.append(count[0])
    live_session.stop(session)
    steps = _steps(receiver)
    assert len(steps) == 5
    for (step, phases), calls in zip(steps, evaluations, strict=True):
        _check_phases(step, phases)
        names = _names(phases)
        assert names.count("forward") == names.count("backward") == calls
        assert names[0] == "data" and names[1] == "optimizer" and names[-1] == "optimizer"
        optimizer = [p for p in phases if _phase(p) == "optimizer"]
        envelope = optimizer[-1].end_time_unix_nano - optimizer[0].start_time_unix_nano
        own = sum(p.end_time_unix_nano - p.start_time_unix_nano for p in optimizer)
        in_closure = [p for p in phases[1:] if _phase(p) != "optimizer"]
        closure_time = sum(p.end_time_unix_nano - p.start_time_unix_nano for p in in_closure)
        assert own + closure_time <= envelope


# --- several optimizers -----------------------------------------------------------------------

ITERATIONS = 30


def _gan(loader: Any | None) -> None:
    """D and G, each stepping its own optimizer once per iteration."""
    torch.manual_seed(0)
    gen, disc = torch.nn.Linear(4, 8), torch.nn.Sequential(torch.nn.Linear(8, 1), torch.nn.Sigmoid())
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    bce = torch.nn.functional.binary_cross_entropy
    batches = iter(loader) if loader is not None else (torch.randn(4, 8) for _ in range(ITERATIONS))
    for real in batches:
        fake = gen(torch.randn(real.shape[0], 4))
        d_loss = bce(disc(real), torch.ones(real.shape[0], 1)) + bce(disc(fake.detach()), torch.zeros(real.shape[0], 1))
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(disc(fake), torch.ones(real.shape[0], 1))
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()


@pytest.mark.parametrize("with_loader", [True, False], ids=["dataloader", "no-dataloader"])
def test_two_optimizers_stepping_once_each_are_one_step(
    receiver: HttpReceiver, tmp_path: Path, with_loader: bool
) -> None:
    session = _start(receiver, tmp_path)
    loader = torch.utils.data.DataLoader(torch.randn(ITERATIONS * 4, 8), batch_size=4) if with_loader else None
    _gan(loader)
    scraped = _scrape(session)  # the last update's step is closed already (with no DataLoader too)
    live_session.stop(session)
    assert scraped["otelprof_steps_total"] == ITERATIONS
    assert scraped["otelprof_micro_batches_total"] == (ITERATIONS if with_loader else 0)
    assert scraped["otelprof_samples_total"] == (ITERATIONS * 4 if with_loader else 0)
    steps = _steps(receiver)
    assert len(steps) == ITERATIONS
    for step, phases in steps:
        _check_phases(step, phases)
        assert _names(phases).count("optimizer") == 2 and _names(phases).count("backward") == 2
        # each forward phase names the root module it timed: gen, then disc three times
        modules = [_module(p) for p in phases if _phase(p) == "forward"]
        assert modules == ["Linear", "Sequential", "Sequential", "Sequential"]
        assert [p.name for p in phases if _phase(p) == "forward"] == [f"forward {m}" for m in modules]
        assert all(_module(p) is None and p.name == _phase(p) for p in phases if _phase(p) != "forward")


def _module(phase: PbSpan) -> str | None:
    return next((kv.value.string_value for kv in phase.attributes if kv.key == "otelprof.phase.module"), None)


# --- evaluation between steps -----------------------------------------------------------------


@pytest.mark.parametrize("eval_loader", [True, False], ids=["eval-dataloader", "eval-tensors"])
def test_evaluation_forwards_are_charged_to_no_step(receiver: HttpReceiver, tmp_path: Path, eval_loader: bool) -> None:
    import time

    session = _start(receiver, tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train = torch.utils.data.DataLoader(torch.randn(12 * 4, 6), batch_size=4)
    held_out = torch.randn(3 * 4, 6)
    evaluations: list[tuple[int, int]] = []
    for i, batch in enumerate(train):
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if i % 4 == 3:  # evaluate every 4 updates
            model.eval()
            with torch.no_grad():
                source = torch.utils.data.DataLoader(held_out, batch_size=4) if eval_loader else held_out.split(4)
                first_end = 0
                for held in source:
                    model(held)
                    first_end = first_end or time.time_ns()
            evaluations.append((first_end, time.time_ns()))  # the first evaluation forward's end to the last's
            model.train()
    scraped = _scrape(session)
    live_session.stop(session)
    assert scraped["otelprof_steps_total"] == 12
    assert scraped["otelprof_samples_total"] == 48 and scraped["otelprof_micro_batches_total"] == 12
    assert scraped["otelprof_eval_forwards_total"] == 3 * 3
    steps = _steps(receiver)
    assert len(steps) == 12
    for step, phases in steps:
        assert _names(phases) == ["data", "forward", "backward", "optimizer"]
        _check_phases(step, phases)
        for start, end in evaluations:  # no step covers an evaluation
            assert step.end_time_unix_nano <= start or end <= step.start_time_unix_nano


# --- edges -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backward", [False, True], ids=["forward-only", "backward-no-optimizer"])
def test_a_loop_without_steps_says_how_to_mark_them(
    receiver: HttpReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture, backward: bool
) -> None:
    """Told after 10 forwards; once backward runs, only after HINT_TRAINING_FORWARDS (gradient
    accumulation runs many forwards before its first update: no false hint)."""
    from otelprof.capture.steps.step import HINT_FORWARDS, HINT_TRAINING_FORWARDS

    due = HINT_TRAINING_FORWARDS if backward else HINT_FORWARDS
    session = _start(receiver, tmp_path)
    model = torch.nn.Linear(4, 1)
    with caplog.at_level(logging.WARNING, logger="otelprof.instrumentation"):
        for _ in range(due + 15):
            out = model(torch.randn(2, 4))  # no optimizer, no otelprof.step()
            if backward:
                out.sum().backward()
    hints = [r.getMessage() for r in caplog.records if "otelprof.step()" in r.getMessage()]
    live_session.stop(session)
    assert len(hints) == 1 and f"{due} forward passes" in hints[0] and "step_scope" in hints[0]
    assert _steps(receiver) == []


def test_explicit_steps_from_a_framework_sum_their_fetches(receiver: HttpReceiver, tmp_path: Path) -> None:
    """What a framework callback does: otelprof.step() after each update, with its step number."""
    session = _start(receiver, tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.randn(5 * 2 * 3, 6), batch_size=3)
    for i, batch in enumerate(loader):
        model(batch).pow(2).mean().backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
            otelprof.step(number=100 + i // 2)
    scraped = _scrape(session)
    live_session.stop(session)
    assert scraped["otelprof_steps_total"] == 5 and scraped["otelprof_samples_total"] == 30
    steps = _steps(receiver)
    assert [(_attrs(s)["otelprof.step.number"], _attrs(s)["otelprof.step.samples"]) for s, _p in steps] == [
        (100 + k, 6) for k in range(5)
    ]
    assert all(_attrs(s)["otelprof.step.micro_batches"] == 2 for s, _p in steps)


@dataclass
class ScrapingReceiver(HttpReceiver):
    """Scrapes the trainer's /metrics while it holds each trace request (before answering)."""

    metrics_url: str = ""
    scrapes: list[tuple[list[int], float | None]] = field(default_factory=list)  # (steps in request, steps_total)

    def _handle(self, handler: Any) -> tuple[int, dict[str, str], bytes]:
        before = len(self.requests)
        reply = super()._handle(handler)
        with self.lock:
            new = self.requests[before:]
        numbers = [
            _attrs(s)["otelprof.step.number"]
            for r in new
            for rs in r.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
            if s.name == "train.step"
        ]
        total: float | None = None
        try:
            text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
            total = next(
                s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "otelprof_steps_total"
            )
        except (OSError, StopIteration):
            pass
        self.scrapes.append((numbers, total))
        return reply


@pytest.mark.slow  # a training subprocess scraped until it exits
def test_the_last_step_is_scrapeable_during_the_shutdown_flush(tmp_path: Path) -> None:
    """The last step (open when the loop breaks) is closed at interpreter shutdown before the
    final flush, and /metrics still answers while that flush runs."""
    import os
    import subprocess
    import sys

    from export.receivers import free_port

    updates, port = 7, free_port()
    receiver = ScrapingReceiver(metrics_url=f"http://127.0.0.1:{port}/metrics")
    with http_receiver(receiver):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
        repo = Path(__file__).resolve().parents[2]
        env |= {
            "PYTHONPATH": os.pathsep.join([str(repo), env.get("PYTHONPATH", "")]),
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
            "OTELPROF_RUN_ID": RUN,
            "OTELPROF_PROFILE": "false",
            "OTELPROF_TRIGGER_SIGNAL": "none",
            "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
        }
        script = Path(__file__).with_name("exit_train.py")
        done = subprocess.run([sys.executable, str(script), str(updates)], env=env, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
    [total] = [t for numbers, t in receiver.scrapes if updates - 1 in numbers]
    assert total == updates  # scraped while the request with the last step was being delivered
    assert sorted(n for numbers, _t in receiver.scrapes for n in numbers) == list(range(updates))
