"""Real CPU profiles recorded with the installed torch, shared by the tests that hold otelprof's
aggregates to torch's own ``key_averages()`` (tests/converter/test_torch_oracle.py,
tests/test_summary.py). Import only after ``pytest.importorskip("torch")``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

STEPS = 3


def _mlp_sgd() -> Callable[[], None]:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))

    def step() -> None:
        with record_function("data"):
            xb = x + 0.01 * torch.randn_like(x)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), y)
        loss.backward()
        opt.step()

    return step


def _convnet_adam() -> Callable[[], None]:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 8 * 8, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with record_function("forward"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with record_function("backward"):
            loss.backward()
        opt.step()

    return step


def _transformer_adamw() -> Callable[[], None]:
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
    head = torch.nn.Linear(32, 1)
    params = list(layer.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    x = torch.randn(2, 8, 32)

    def step() -> None:
        opt.zero_grad()
        loss = head(layer(x)).pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    return step


MODELS: dict[str, Callable[[], Callable[[], None]]] = {
    "mlp_sgd": _mlp_sgd,
    "convnet_adam": _convnet_adam,
    "transformer_adamw": _transformer_adamw,
}


@dataclass
class Recording:
    path: Path
    key_averages: Any
    key_averages_by_shape: Any  # key_averages(group_by_input_shape=True)


def record(tmp: Path, model: str, **kwargs: Any) -> Recording:
    """Profile STEPS training steps (after one warm-up step) with a schedule, so that torch
    records ``ProfilerStep#N`` annotations; export the trace and keep torch's own aggregates."""
    torch.manual_seed(0)
    path = tmp / f"{model}.pt.trace.json"
    captured: list[Any] = []

    def on_ready(prof: Any) -> None:
        prof.export_chrome_trace(str(path))
        captured.append((prof.key_averages(), prof.key_averages(group_by_input_shape=True)))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step = MODELS[model]()
        step()  # lazy initialisation (optimizer state, allocator) outside the window
        schedule = torch.profiler.schedule(wait=0, warmup=1, active=STEPS, repeat=1)
        with profile(
            activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule, on_trace_ready=on_ready, **kwargs
        ) as prof:
            for _ in range(1 + STEPS):
                step()
                prof.step()
    finally:
        torch.set_num_threads(threads)
    assert len(captured) == 1 and path.is_file()
    return Recording(path, *captured[0])


_RECORDINGS: dict[str, Recording] = {}


def recorded(tmp_path_factory: pytest.TempPathFactory, model: str, **kwargs: Any) -> Recording:
    """One recording per (model, profiler options) for the whole test session."""
    key = model + repr(sorted(kwargs.items()))
    if key not in _RECORDINGS:
        _RECORDINGS[key] = record(tmp_path_factory.mktemp("torch"), model, **kwargs)
    return _RECORDINGS[key]
