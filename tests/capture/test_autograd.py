"""Forward passes that autograd runs inside backward (reentrant activation checkpointing
recomputes the forward during backward) neither split nor duplicate a step: the recomputed
forward pauses the backward phase (phases never overlap), so it sits between two backward
intervals of its step."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from export.receivers import http_receiver

from capture import live_session

torch = pytest.importorskip("torch")

STEPS = 4


def _checkpointed() -> Any:
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

        def forward(self, x: Any) -> Any:
            return checkpoint(self.inner, x, use_reentrant=True)

    return Checkpointed()


def test_checkpoint_recomputation_stays_inside_its_step(tmp_path: Path) -> None:
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp_path, OTELPROF_RUN_ID="ckpt", OTELPROF_PROFILE="false")
        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(torch.randn(STEPS * 4, 16, requires_grad=True), batch_size=4)
        model = _checkpointed()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in loader:
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        live_session.stop(session)
    steps = [s for s in rec.spans if s.name == "train.step"]
    assert [next(kv.value.int_value for kv in s.attributes if kv.key == "otelprof.step.number") for s in steps] == list(
        range(STEPS)
    )
    for step in steps:
        phases = sorted(
            (s for s in rec.spans if s.parent_span_id == step.span_id), key=lambda s: s.start_time_unix_nano
        )
        # the recomputation autograd runs inside backward is backward time: one forward per step
        assert [p.name for p in phases] == ["data", "forward Checkpointed", "backward", "optimizer"]
        for before, after in itertools.pairwise(phases):
            assert before.end_time_unix_nano <= after.start_time_unix_nano  # no overlap
        assert step.start_time_unix_nano <= phases[0].start_time_unix_nano
        assert phases[-1].end_time_unix_nano <= step.end_time_unix_nano
