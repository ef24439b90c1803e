"""torch.compile under otelprof: the same graphs, graph breaks, frames and recompiles as without
it (torch._dynamo's counters), no warning, and steps and phases still counted exactly.

Whole loops run as subprocesses (compile_loop.py), plain and under ``otelprof run``: dynamo's
state is per process, and the user's log is the process's stderr."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from export.receivers import http_receiver

from otelprof._native_module import native
from otelprof.capture.steps.hooks import TorchHooks
from otelprof.capture.steps.tracker import Step, step_tracker

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
LOOP = HERE / "compile_loop.py"
STEPS = 4  # compile_loop.STEPS


def _run(backend: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """compile_loop.py's JSON and stderr; under ``otelprof run`` when ``env`` is given."""
    command = [sys.executable, str(LOOP), backend]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTELPROF_", "OTEL_"))}
    if env is not None:
        command = [sys.executable, "-m", "otelprof", "run", "--", *command]
        environ.update(env)
    out = subprocess.run(command, env=environ, cwd=HERE, capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


#: what inductor's on-disk caches change between a cold run and a warm one: its cache counters
#: and the frames a cold compile runs (dynamo counts them, and the generators among them it
#: declines as "unimplemented"; a warm run has neither); aot_eager compares them too
#: (a cold compile also records the mm shapes it tuned, "aten_mm_info", and leaves an empty
#: "graph_break" table where a warm run has none)
CACHE_DEPENDENT = {
    "inductor": ("frames", "aot_autograd", "inductor", "unimplemented", "aten_mm_info"),
    "aot_eager": (),
}


@pytest.mark.slow  # real torch.compile of a training loop, twice
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_loops_compile_the_same_with_otelprof(backend: str, tmp_path: Path) -> None:
    off, off_err = _run(backend)
    with http_receiver() as rec:
        on, on_err = _run(
            backend,
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}",
                "OTEL_METRICS_EXPORTER": "none",
                "OTELPROF_PROFILE": "false",
                "OTELPROF_RUN_ID": f"compile-{backend}",
                "OTELPROF_SPOOL_DIR": str(tmp_path),
            },
        )
        spans = rec.spans
    for case in ("model", "fn"):
        assert on[case]["counters"]["stats"]["unique_graphs"] == 1
        assert len(on[case]["counters"].get("graph_break", {})) == (1 if case == "fn" else 0)  # Tensor.backward
        assert on[case]["losses"] == off[case]["losses"]
        for key in CACHE_DEPENDENT[backend]:
            on[case]["counters"].pop(key, None)
            off[case]["counters"].pop(key, None)
        for side in (on, off):  # an empty counter table is the same as none
            side[case]["counters"] = {k: v for k, v in side[case]["counters"].items() if v}
        assert on[case]["counters"] == off[case]["counters"]  # graphs, breaks, recompiles, frames...
    assert on_err == off_err == ""  # no warning in the user's log
    steps = sorted((s for s in spans if s.name == "train.step"), key=lambda s: s.start_time_unix_nano)
    assert len(steps) == 2 * STEPS
    # the phases (a forward span's name adds its module: "forward Sequential")
    phases = [[c.name.split(" ")[0] for c in spans if c.parent_span_id == step.span_id] for step in steps]
    # the compiled model is timed around its call (the loss module is no second forward); a
    # forward inside a compiled function is not timed (a hook there would break the graph)
    model, fn = ["data", "forward", "backward", "optimizer"], ["data", "backward", "optimizer"]
    assert phases == [model] * STEPS + [fn] * STEPS


KINDS = [
    pytest.param(False, id="python"),
    pytest.param(True, id="native", marks=pytest.mark.skipif(native is None, reason="the native core is not built")),
]


@pytest.fixture
def dynamo_counters() -> Iterator[Any]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def _global_forward_hooks() -> int:
    from torch.nn.modules import module as nn_module

    return len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)


@pytest.mark.parametrize("native", KINDS)
def test_root_hooks_inside_a_compiled_function_are_no_ops(
    native: bool,
    dynamo_counters: Any,
    monkeypatch: pytest.MonkeyPatch,
    recwarn: pytest.WarningsRecorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Eager steps find the model; a compiled function then calls it: its root hooks are traced
    as no-ops (no graph break, no recompile), discovery ends and never returns."""
    from otelprof.capture.steps import hooks as hooks_module

    monkeypatch.setattr(hooks_module, "REDISCOVER_STEPS", 3)  # would rediscover at the 3rd step_done
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)

    def loss_of(x: Any) -> Any:
        return model(x).pow(2).mean()

    def counted(fn: Any) -> dict[str, Any]:
        dynamo_counters.clear()
        step = torch.compile(fn, backend="aot_eager")
        for _ in range(3):
            step(x).backward()
            opt.step()
            opt.zero_grad()
        return {k: dict(v) for k, v in dynamo_counters.items()}

    plain = counted(lambda x: loss_of(x))  # without otelprof
    torch._dynamo.reset()
    steps: list[Step] = []
    hooks = TorchHooks(step_tracker(steps.append, native=native))
    hooks.install()
    try:
        for _ in range(2):  # eager: step 0 discovers the model
            loss_of(x).backward()
            opt.step()
            opt.zero_grad()
            hooks.step_done()
        assert hooks.forward is not None and [type(m).__name__ for m in hooks.forward.roots()] == ["Sequential"]
        hooked = counted(lambda x: loss_of(x))
        for _ in range(2):
            hooks.step_done()  # no discovery after a compile
            assert _global_forward_hooks() == 0
        assert hooks.forward.compiled and hooks.forward.discoveries == 1
        hooks._tracker.finish()
    finally:
        hooks.remove()
    assert hooked == plain and plain["stats"]["unique_graphs"] == 1 and "graph_break" not in plain
    assert not [str(w.message) for w in recwarn]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # dynamo logs none
    assert [[p[0] for p in s.phases] for s in steps] == [["forward", "backward", "optimizer"]] * 2 + [
        ["backward", "optimizer"]
    ] * 3


def test_dynamo_integration_survives_reset_and_is_undone() -> None:
    """torch._dynamo.reset() forgets compile callbacks: otelprof's comes back; remove() leaves
    dynamo as it found it."""
    import torch._dynamo as dynamo
    from torch._dynamo.callback import callback_handler

    original_reset = dynamo.reset
    ignored_before = set(dynamo.config.ignore_logging_functions)
    callbacks_before = list(callback_handler.start_callbacks)
    tracker = step_tracker(lambda s: None)
    hooks = TorchHooks(tracker)
    hooks.install()
    try:
        assert tracker.begin_forward in dynamo.config.ignore_logging_functions
        ours = [c for c in callback_handler.start_callbacks if c not in callbacks_before]
        assert len(ours) == 1
        dynamo.reset()
        assert callback_handler.start_callbacks == ours  # reset() cleared it; it is back
    finally:
        hooks.remove()
    assert dynamo.reset is original_reset
    assert set(dynamo.config.ignore_logging_functions) == ignored_before
    assert callback_handler.start_callbacks == []


def test_a_failing_dynamo_setup_is_logged_once_and_undone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch._dynamo as dynamo

    from otelprof.capture.steps import dynamo as otelprof_dynamo

    def half_done(self: Any) -> None:
        dynamo.config.ignore_logging_functions.add(self._hooks[0])
        self._ignored.append(self._hooks[0])
        raise RuntimeError("another dynamo")

    monkeypatch.setattr(otelprof_dynamo.DynamoHooks, "_setup_locked", half_done)
    ignored_before = set(dynamo.config.ignore_logging_functions)
    hooks = TorchHooks(step_tracker(lambda s: None))
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        hooks.install()
        hooks.remove()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("otelprof")] == [
        "otelprof could not keep its hooks out of torch.compile's way; compiled code may recompile or break "
        "its graph at them"
    ]
    assert set(dynamo.config.ignore_logging_functions) == ignored_before


@pytest.mark.parametrize("native", KINDS)
def test_a_model_compiled_later_is_timed_around_its_compiled_call(
    native: bool, dynamo_counters: Any, recwarn: pytest.WarningsRecorder
) -> None:
    """Roots found in eager steps, then ``torch.compile(model)``: the OptimizedModule becomes a
    root (from its second call: the first is under way when dynamo starts), nothing recompiles."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)

    def train(module: Any, steps: int, hooks: TorchHooks | None = None) -> None:
        for _ in range(steps):
            module(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if hooks is not None:
                hooks.step_done()

    train(torch.compile(model, backend="aot_eager"), 3)
    plain = {k: dict(v) for k, v in dynamo_counters.items()}
    torch._dynamo.reset()
    dynamo_counters.clear()
    steps: list[Step] = []
    hooks = TorchHooks(step_tracker(steps.append, native=native))
    hooks.install()
    try:
        train(model, 2, hooks)  # eager: the model is the root
        train(torch.compile(model, backend="aot_eager"), 3, hooks)
        hooks._tracker.finish()
    finally:
        hooks.remove()
    assert {k: dict(v) for k, v in dynamo_counters.items()} == plain and plain["stats"]["unique_graphs"] == 1
    assert not [str(w.message) for w in recwarn]
    timed = ["forward", "backward", "optimizer"]
    assert [[p[0] for p in s.phases] for s in steps] == [timed] * 2 + [["backward", "optimizer"]] + [timed] * 2
    # the forward phase names the model, eager or compiled (an OptimizedModule: the module it wraps)
    assert [[m for m in s.phase_modules if m] for s in steps] == [["Sequential"]] * 2 + [[]] + [["Sequential"]] * 2
