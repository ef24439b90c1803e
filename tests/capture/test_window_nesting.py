"""A profiled step nests inside its live step, in a real training loop with a profiling window:
``ProfilerStep#N`` never outlives its ``train.step`` (otelprof closes its range in the callback
after the tracker has ended the step), and the loss, computed between the model's forward and
the backward, sits under the ``forward`` phase. Both step routes: the native sink, and the
Python one (the reference tracker, used without the native core)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import native_module
from export.receivers import HttpReceiver, http_receiver

from capture import live_session
from otelprof.otlp import ids

torch = pytest.importorskip("torch")

STEPS = 8
PROFILED = (3, 4)  # skip 0-1, warm up 2, record 3-4
WINDOW = {
    **live_session.ONE_WINDOW,
    "OTELPROF_RUN_ID": "nesting",
    "OTELPROF_MIN_DURATION_US": "0",  # every operator a span
}


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


def _train() -> list[float]:
    """A regression loop whose loss is computed (and logged) after the model's forward."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS * 4, 16), torch.randn(STEPS * 4, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in loader:
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return losses


def _ancestors(span: Any, by_id: dict[bytes, Any]) -> list[Any]:
    chain = []
    while span.parent_span_id:
        span = by_id[span.parent_span_id]
        chain.append(span)
    return chain


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        field = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, field) if field else None
    return out


@pytest.mark.parametrize("route", ["native", "python"])
def test_profiled_steps_nest_inside_their_steps(
    receiver: HttpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    from otelprof.capture import session as session_module
    from otelprof.capture.steps.native_tracker import step_tracker

    if route == "native":
        native_module()
    else:
        monkeypatch.setattr(session_module, "step_tracker", functools.partial(step_tracker, native=False))
    session = live_session.start(receiver.port, tmp_path, **WINDOW)
    losses = _train()
    assert (session._sink is None) == (route == "python")  # which route the steps took
    live_session.stop(session)
    assert len(losses) == STEPS
    by_trace: dict[bytes, list[Any]] = {}
    for span in receiver.spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    for n in PROFILED:
        spans = by_trace[ids.trace_id(f"step|nesting|{n}")]
        by_id = {s.span_id: s for s in spans}
        [root] = [s for s in spans if not s.parent_span_id]
        assert root.name == "train.step" and _attrs(root)["otelprof.step.number"] == n
        [marker] = [s for s in spans if s.name == f"ProfilerStep#{n}"]
        assert marker.parent_span_id == root.span_id
        # the profiled step lies within its step
        assert root.start_time_unix_nano <= marker.start_time_unix_nano
        assert marker.end_time_unix_nano <= root.end_time_unix_nano
        phases = [s for s in spans if s.parent_span_id == root.span_id and s is not marker]
        [forward] = [s for s in phases if _attrs(s).get("otelprof.phase.name") == "forward"]
        [loss] = [s for s in spans if s.name == "aten::mse_loss"]  # one loss a step
        assert forward in _ancestors(loss, by_id)
        assert _ancestors(loss, by_id)[-1] is root
