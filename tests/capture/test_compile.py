"""torch.compile'd models under the instrumentor: dynamo traces through the module hooks
without breaking the run, and steps and phases are counted once."""

from __future__ import annotations

from pathlib import Path

import pytest
from export.receivers import http_receiver

from capture import live_session

torch = pytest.importorskip("torch")

STEPS = 6


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_model_steps_and_phases_once(backend: str, tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(STEPS * 4, 16), batch_size=4)
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp_path, OTELPROF_RUN_ID="compiled", OTELPROF_PROFILE="false")
        losses = []
        for batch in loader:
            loss = compiled(batch).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        live_session.stop(session)
    assert losses[-1] < losses[0]  # it trained
    assert not [w for w in recwarn if "global hooks" in str(w.message)]  # nothing about our hooks
    steps = [s for s in rec.spans if s.name == "train.step"]
    assert len(steps) == STEPS
    for step in steps:
        phases = [s.name for s in rec.spans if s.parent_span_id == step.span_id]
        assert phases == ["data", "forward", "backward", "optimizer"]
