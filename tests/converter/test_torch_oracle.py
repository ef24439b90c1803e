"""The installed torch is the oracle: convert traces it records right here and compare the
per-op aggregates with its own ``prof.key_averages()``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import Decoded, RawTrace, convert_cached, decode, fwdbwd_pairs, load_raw

torch = pytest.importorskip("torch")
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

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


def _record(tmp: Path, model: str, **kwargs: Any) -> Recording:
    """Profile STEPS training steps (after one warm-up step) with a schedule, so that torch
    records ``ProfilerStep#N`` annotations; export the trace and keep torch's own aggregates."""
    torch.manual_seed(0)
    path = tmp / f"{model}.pt.trace.json"
    captured: list[Any] = []

    def on_ready(prof: Any) -> None:
        prof.export_chrome_trace(str(path))
        captured.append(prof.key_averages())

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
    return Recording(path, captured[0])


PROFILES = [
    ("mlp_sgd", {}),
    ("convnet_adam", {"profile_memory": True}),
    ("transformer_adamw", {}),
    ("mlp_sgd", {"with_stack": True}),
    ("transformer_adamw", {"with_stack": True, "profile_memory": True}),
]


_RECORDINGS: dict[str, Recording] = {}


@pytest.fixture(scope="module", params=PROFILES, ids=lambda p: p[0] + "".join(f"+{k}" for k in p[1]))
def recording(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """One recording per profile for the session (both engines convert the same file)."""
    model, kwargs = request.param
    key = model + repr(sorted(kwargs.items()))
    if key not in _RECORDINGS:
        _RECORDINGS[key] = _record(tmp_path_factory.mktemp("torch"), model, **kwargs)
    return _RECORDINGS[key]


def test_ops_match_key_averages(recording: Recording, engine: str) -> None:
    result = convert_cached(recording.path, engine, detail="full")
    ours = {(o.name, o.kind): o for o in result.ops if o.kind in ("op", "annotation")}
    theirs = {}
    for evt in recording.key_averages:
        if evt.key == "[memory]":
            continue
        key = (evt.key, "annotation" if evt.is_user_annotation else "op")
        assert key not in theirs
        theirs[key] = evt
    assert len(theirs) > 20
    problems = []
    for key, evt in theirs.items():
        row = ours.get(key)
        if row is None:
            problems.append(f"{key}: missing from ConvertResult.ops")
            continue
        self_us, total_us = row.self_cpu_ns / 1000, row.cpu_total_ns / 1000
        if row.calls != evt.count:
            problems.append(f"{key}: calls {row.calls} != torch count {evt.count}")
        if abs(self_us - evt.self_cpu_time_total) > 1.0:
            problems.append(f"{key}: self cpu {self_us} us != torch {evt.self_cpu_time_total} us")
        if abs(total_us - evt.cpu_time_total) > 1.0 * max(1, evt.count):
            problems.append(f"{key}: cpu total {total_us} us != torch {evt.cpu_time_total} us")
        if row.device_total_ns or row.self_device_ns:
            problems.append(f"{key}: device time on a CPU-only profile")
    extra = sorted(set(ours) - set(theirs))
    assert not extra, f"rows torch does not report: {extra}"
    assert not problems, "\n".join(problems)
    assert ("ProfilerStep*", "annotation") in ours and ours[("ProfilerStep*", "annotation")].calls == STEPS
    assert not [o for o in result.ops if o.kind == "device"]


def test_op_spans_carry_self_time(recording: Recording, engine: str) -> None:
    d = decode(convert_cached(recording.path, engine, detail="full"))
    ops = [s for s in d.spans if s.category in ("cpu_op", "user_annotation", "python_function")]
    assert ops
    total_self = sum(s.attrs["pytorch.op.self_cpu_time_ns"] for s in ops)
    assert total_self == sum(o.self_cpu_ns for o in d.result.ops)
    for s in ops:
        assert s.attrs["pytorch.op.self_cpu_time_ns"] <= s.end - s.start
        assert s.attrs["pytorch.op.self_device_time_ns"] == 0
        if s.category == "cpu_op":
            assert s.attrs["pytorch.op.self_cpu_time_ns"] >= 0
        # python frames can go negative, exactly as in torch: a record_function annotation opened
        # in __enter__ and closed in __exit__ overlaps both of them, so the frame's children
        # add up to more than the frame itself (key_averages shows the same negative self time)


def test_steps_and_fwdbwd_links(recording: Recording, engine: str) -> None:
    raw: RawTrace = load_raw(recording.path)
    d: Decoded = decode(convert_cached(recording.path, engine, detail="full"))
    steps = [s for s in d.spans if "pytorch.step" in s.attrs]
    assert len(steps) == STEPS
    assert all(not s.parent_id and s.name == f"ProfilerStep#{s.attrs['pytorch.step']}" for s in steps)
    assert len({s.trace_id for s in steps}) == STEPS
    assert d.resource["otelprof.run.id"] == raw.doc["trace_id"]
    pairs = fwdbwd_pairs(raw)
    assert len(pairs) >= STEPS, "torch records fwdbwd flows for autograd ops"
    links = [(s, lk) for s in d.spans for lk in s.links if lk.attrs.get("otelprof.link.kind") == "fwdbwd"]
    assert len(links) == len(pairs)
    for source, lk in links:
        target = d.by_id[lk.span_id]
        assert target.attrs["pytorch.op.sequence_number"] == source.attrs["pytorch.op.sequence_number"]
        assert target.start < source.start
        assert "Backward" in source.name or "backward" in source.name.lower()
        # forward and backward of a step are in that step's trace
        assert target.trace_id == source.trace_id == lk.trace_id
    # default detail keeps the links of ops it keeps, and never links an op to itself
    default = decode(convert_cached(recording.path, engine, detail="default"))
    for s in default.spans:
        for lk in s.links:
            assert lk.span_id != s.span_id and lk.span_id in default.by_id


def test_memory_events(recording: Recording, engine: str) -> None:
    raw = load_raw(recording.path)
    mem = [e for e in raw.events if e.get("ph") == "i" and e.get("name") == "[memory]"]
    d = decode(convert_cached(recording.path, engine, detail="full"))
    events = [(s, ev) for s in d.spans for ev in s.events]
    assert d.result.stats["memory_events"] == len(mem)
    assert len(events) == len(mem) - d.result.stats["memory_events_dropped"]
    if not mem:
        return
    assert sum(1 for s, _ in events if s.category == "cpu_op") > 0
    for s, ev in events:
        assert ev.name == "pytorch.memory" and isinstance(ev.attrs["pytorch.memory.bytes"], int)
        if s.category == "cpu_op":
            assert s.start <= ev.time <= s.end
    peaks = [s.attrs.get("pytorch.memory.peak_allocated_bytes") for s in d.spans if "pytorch.step" in s.attrs]
    assert all(isinstance(p, int) and p > 0 for p in peaks)
