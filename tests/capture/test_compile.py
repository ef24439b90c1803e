"""torch.compile under otelprof: the same graphs, graph breaks, frames and recompiles as without
it (torch._dynamo's counters), no warning, and steps and phases still counted exactly.

Whole loops run as subprocesses (compile_loop.py, compile_cases.py), plain and under ``otelprof
run``: dynamo's state is per process, and the user's log is the process's stderr. Every run
compiles on a cold inductor cache of its own, as a first run on a machine does: a warm one skips
the compile (and the repro script inductor writes at each compile, which names every function in
``ignore_logging_functions``), so it would hide what otelprof puts there."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from export.receivers import http_receiver

from otelprof._native_module import native
from otelprof.capture.steps.hooks import TorchHooks
from otelprof.capture.steps.native_tracker import step_tracker
from otelprof.capture.steps.step import Step

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
LOOP = HERE / "compile_loop.py"
CASES = HERE / "compile_cases.py"
STEPS = 4  # compile_loop.STEPS
#: compile_cases.CASES, in order, and compile_cases.STEPS
MODES = ("reduce-overhead", "max-autotune-no-cudagraphs", "fullgraph", "optimizer")
MODE_STEPS = 3


def _run(args: list[str], cache: Path, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """The script's JSON and stderr, compiled on the fresh inductor cache ``cache``; under
    ``otelprof run`` when ``env`` is given."""
    command = [sys.executable, *args]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTELPROF_", "OTEL_", "TORCH", "TRITON_"))}
    environ.update(TORCHINDUCTOR_CACHE_DIR=str(cache), TRITON_CACHE_DIR=str(cache / "triton"))
    if env is not None:
        command = [sys.executable, "-m", "otelprof", "run", "--", *command]
        environ.update(env)
    out = subprocess.run(command, env=environ, cwd=HERE, capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _otelprof(tmp_path: Path, port: int, run_id: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_METRICS_EXPORTER": "none",
        "OTELPROF_PROFILE": "false",
        "OTELPROF_RUN_ID": run_id,
        "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
        "OTELPROF_QUIET": "true",  # the logs are compared: without the line saying where spans go
    }


def _log(stderr: str) -> list[str]:
    """The lines of a log, less what differs between two runs (torch's time and pid prefix)."""
    return [re.sub(r"^([DIWEC])\d{4} [\d:.]+ \d+ ", r"\1 ", line) for line in stderr.splitlines()]


def _phases(spans: list[Any]) -> list[list[str]]:
    """The phases of each ``train.step`` span, in time order (a forward span's name adds its
    module: "forward Sequential")."""
    steps = sorted((s for s in spans if s.name == "train.step"), key=lambda s: s.start_time_unix_nano)
    return [[c.name.split(" ")[0] for c in spans if c.parent_span_id == step.span_id] for step in steps]


@pytest.mark.slow  # real torch.compile of a training loop, twice
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_loops_compile_the_same_with_otelprof(backend: str, tmp_path: Path) -> None:
    off, off_err = _run([str(LOOP), backend], tmp_path / "off")
    with http_receiver() as rec:
        on, on_err = _run([str(LOOP), backend], tmp_path / "on", _otelprof(tmp_path, rec.port, f"compile-{backend}"))
        spans = rec.spans
    for case in ("model", "fn"):
        assert on[case]["counters"]["stats"]["unique_graphs"] == 1
        assert len(on[case]["counters"].get("graph_break", {})) == (1 if case == "fn" else 0)  # Tensor.backward
        assert on[case]["losses"] == off[case]["losses"]
        for side in (on, off):  # an empty counter table is the same as none
            side[case]["counters"] = {k: v for k, v in side[case]["counters"].items() if v}
        # graphs, breaks, recompiles, frames, cache misses (both cold)...
        assert on[case]["counters"] == off[case]["counters"]
    assert on_err == off_err == ""  # no warning in the user's log
    phases = _phases(spans)
    assert len(phases) == 2 * STEPS
    # the compiled model is timed around its call (the loss module is no second forward); a
    # forward inside a compiled function is not timed (a hook there would break the graph)
    model, fn = ["data", "forward", "backward", "optimizer"], ["data", "backward", "optimizer"]
    assert phases == [model] * STEPS + [fn] * STEPS


@pytest.mark.slow  # real inductor compiles, each on a cold cache, twice
def test_inductor_modes_compile_the_same_with_otelprof(tmp_path: Path) -> None:
    """compile_cases.py: modes reduce-overhead (no CUDA graphs on a CPU) and
    max-autotune-no-cudagraphs, fullgraph=True around otelprof's forward hooks, a compiled
    optimizer step around its step hooks: the same counters, results and log as without
    otelprof, and every step otelprof can see measured."""
    off, off_err = _run([str(CASES)], tmp_path / "off")
    with http_receiver() as rec:
        on, on_err = _run([str(CASES)], tmp_path / "on", _otelprof(tmp_path, rec.port, "compile-modes"))
        spans = rec.spans
    assert list(on) == list(off) == list(MODES)
    for mode in MODES:
        # graphs, graph breaks, recompiles, frames, inductor's cache misses; losses and weights
        assert on[mode] == off[mode], mode
        assert on[mode]["counters"]["stats"]["unique_graphs"] >= 1
    assert "graph_break" not in on["fullgraph"]["counters"]
    assert _log(on_err) == _log(off_err)  # no new warning (torch warns of the optimizer's record_function)
    phases = _phases(spans)
    # every step of the first three cases. The first model compiled is timed around its call;
    # root discovery ends at that compile, so the next case's model is not found (a loop trains
    # one model), and a forward inside a compiled function is not timed. A compiled optimizer
    # step runs otelprof's optimizer hooks inside its graphs, as no-ops: its steps end in none
    # (one step is one optimizer update otelprof sees), so the last case counts no step
    timed, untimed = ["data", "forward", "backward", "optimizer"], ["data", "backward", "optimizer"]
    assert phases == [timed] * MODE_STEPS + [untimed] * 2 * MODE_STEPS


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


@pytest.mark.parametrize("native", KINDS)
def test_ignored_hooks_are_well_formed_functions(native: bool) -> None:
    """Inductor writes dynamo's config into a repro script at every compile that misses its cache
    (``codegen_config``: ``module.name`` for each function in ``ignore_logging_functions``): it
    writes otelprof's hooks while they are installed, and only then (the config's copies follow
    the set), and the native ones name stand-ins that do what the hooks do in compiled code:
    nothing."""
    import importlib

    import torch._dynamo as dynamo

    before = set(dynamo.config.ignore_logging_functions)
    assert "otelprof" not in dynamo.config.codegen_config()  # the config's copy, made before
    hooks = TorchHooks(step_tracker(lambda s: None, native=native))
    hooks.install()
    try:
        ours = set(dynamo.config.ignore_logging_functions) - before
        script = dynamo.config.codegen_config()  # TypeError on a function with no __module__
    finally:
        hooks.remove()
    assert "otelprof" not in dynamo.config.codegen_config()
    assert len(ours) == (9 if native else 8)  # the Python tracker's data_end is a method: not a function
    assert f"import {next(iter(ours)).__module__}" in script.splitlines()
    assert {f"{h.__module__}.{h.__name__}" for h in ours} <= set(re.findall(r"[\w.]+", script))
    if native:
        for hook in ours:
            stand_in = getattr(importlib.import_module(hook.__module__), hook.__name__)
            assert stand_in.__name__ == hook.__name__ and stand_in(torch.nn.Linear(1, 1), (), {}) is None


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
