"""The forward hooks move from global hooks to the root modules after the first step, and come
back for one step every REDISCOVER_STEPS to find models first called later."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from otelprof._native_module import native
from otelprof.capture.steps import hooks as hooks_module
from otelprof.capture.steps.hooks import TorchHooks
from otelprof.capture.steps.native_tracker import step_tracker
from otelprof.capture.steps.step import HINT_TRAINING_FORWARDS, Step

torch = pytest.importorskip("torch")


def _global_forward_hooks() -> int:
    from torch.nn.modules import module as nn_module

    return len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)


KINDS = [
    pytest.param(False, id="python"),
    pytest.param(True, id="native", marks=pytest.mark.skipif(native is None, reason="the native core is not built")),
]


@pytest.mark.parametrize("native", KINDS)
def test_forward_hooks_move_to_the_roots_and_come_back(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(hooks_module, "REDISCOVER_STEPS", 3)
    steps: list[Step] = []
    tracker = step_tracker(steps.append, native=native)
    hooks = TorchHooks(tracker)
    before = _global_forward_hooks()
    hooks.install()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    loss_fn = torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    late = torch.nn.Linear(1, 1)  # a model first called in step 4
    x, y = torch.randn(2, 4), torch.randn(2, 1)
    seen_roots = []
    try:
        for i in range(8):
            out = model(x)
            if i >= 4:
                out = late(out)
            loss_fn(out, y).backward()
            opt.step()
            tracker.phase_begin("data")  # as a DataLoader fetch would: closes the step
            tracker.phase_end("data")
            hooks.step_done()
            assert hooks.forward is not None
            seen_roots.append((hooks.forward.discovering, {type(m).__name__ for m in hooks.forward.roots()}))
        assert _global_forward_hooks() == before  # on the roots now
    finally:
        hooks.remove()
    assert _global_forward_hooks() == before
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in (model, loss_fn, late))
    # step 0 discovers the model (the loss module has no parameters: no root); after steps 2 and
    # 5 the global hooks return for a step; `late`, first called in step 4, is found in step 6
    old, new = {"Sequential"}, {"Sequential", "Linear"}
    assert (
        seen_roots
        == [(False, old), (False, old), (True, set()), (False, old), (False, old), (True, set())] + [(False, new)] * 2
    )
    # each root call is one forward interval, whichever hooks saw it; `late` is missed in the
    # steps between its first call and the next discovery (4 and 5)
    assert [len([p for p in s.phases if p[0] == "forward"]) for s in steps] == [1, 1, 1, 1, 1, 1, 2, 2]


@pytest.mark.parametrize("native", KINDS)
def test_a_step_ending_after_remove_installs_nothing(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """uninstrument() removes the hooks, then finish() ends the last step: the step's boundary
    must not bring the forward hooks back (a discovery step, or the 1000th step)."""
    monkeypatch.setattr(hooks_module, "REDISCOVER_STEPS", 1)
    hooks = TorchHooks(step_tracker(lambda s: None, native=native))
    before = _global_forward_hooks()
    hooks.install()
    model = torch.nn.Linear(2, 1)
    model(torch.randn(1, 2))  # found by the discovery hooks
    hooks.remove()
    hooks.step_done()
    assert _global_forward_hooks() == before
    assert not model._forward_pre_hooks and not model._forward_hooks


@pytest.mark.parametrize("native", KINDS)
@pytest.mark.parametrize("fails", [False, True], ids=["", "forward-raises"])
def test_a_loop_that_ends_no_step_hands_over_to_the_roots(native: bool, fails: bool) -> None:
    """No optimizer.step() and no otelprof.step(): the tracker's hint (after HINT_TRAINING_FORWARDS
    forwards, as backward runs: gradient accumulation is not told apart before then) moves the
    forward hooks to the roots at the next outermost call (otherwise the global hooks, and
    torch's slow hook path for every module call, stay for good). Forwards stay timed: steps
    marked afterwards have their forward phase, and a forward that raises at the hand-over
    raises its own error."""
    steps: list[Step] = []
    hints: list[int] = []
    hooks: list[TorchHooks] = []

    def on_hint(forwards: int) -> None:  # as the session's
        hints.append(forwards)
        hooks[0].no_steps()

    tracker = step_tracker(steps.append, native=native, on_hint=on_hint)
    hooks.append(TorchHooks(tracker))
    before = _global_forward_hooks()
    hooks[0].install()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(2, 4)

    def update() -> None:  # by hand: no optimizer, so no step boundary
        model(x).pow(2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None

    try:
        for _ in range(HINT_TRAINING_FORWARDS):
            update()
        forward = hooks[0].forward
        assert forward is not None
        assert hints == [HINT_TRAINING_FORWARDS] and forward.discovering  # the next outermost call hands over
        tracker.step()  # the loop marks its steps from here on
        if fails:  # torch runs the always-called post hooks as it raises (iterating their dicts)
            with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
                model(torch.randn(2, 5))
        else:
            update()
        assert not forward.discovering and _global_forward_hooks() == before
        assert [type(m).__name__ for m in forward.roots()] == ["Sequential"]
        tracker.step()
        handed_over = steps[-1]  # the step of the call that handed over: its forward timed
        assert handed_over.phase_totals_ns.get("forward", 0) > 0
        for _ in range(2):
            update()
            tracker.step()
        assert all(s.phase_totals_ns.get("forward", 0) > 0 for s in steps[-2:])
    finally:
        hooks[0].remove()
    assert _global_forward_hooks() == before
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_the_session_hands_over_when_it_hints(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """otelprof.instrument() wires the hint to the hand-over: a forward-only loop (inference, an
    update by hand) keeps no global module hook once it is told how to mark steps."""
    import otelprof

    env = {
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
        "OTELPROF_RUN_ID": "hint",
        "OTELPROF_PROFILE": "false",
    }
    before = _global_forward_hooks()
    session = otelprof.instrument(environ=env, registry=CollectorRegistry())
    assert session is not None
    try:
        model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            for _ in range(12):
                model(torch.randn(2, 4))
        assert "no steps are recorded" in caplog.text
        assert _global_forward_hooks() == before
        assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
    finally:
        otelprof.uninstrument()
    assert _global_forward_hooks() == before and not model._forward_hooks
