"""Profiling windows in a real training loop: torch.profiler's schedule decides which steps are
recorded, and their operator spans arrive in the same traces as the live step spans."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import native_module
from export.receivers import HttpReceiver, http_receiver
from prometheus_client import CollectorRegistry

import otelprof
from capture import live_session
from otelprof.otlp import ids

torch = pytest.importorskip("torch")

PHASES = ("data", "forward", "backward", "optimizer")  # the step encoder's phase spans

STEPS = 10
# the native step path, and the Python one (OTLP metrics on): the latter takes about 5 s a test
# against the native path's 0.5 s, so it runs in the full suite only (slow)
METRICS = [
    pytest.param("prometheus", id="native-steps"),
    pytest.param("prometheus,otlp", id="python-steps", marks=pytest.mark.slow),
]


def _train(steps: int = STEPS, between: Any = None, last: int | None = None) -> None:
    """``steps`` updates; ``last``: the loop breaks after that update (no fetch ends its step)."""
    torch.manual_seed(0)
    data = torch.randn(steps * 4, 16)
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, batch in enumerate(loader):
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if between is not None:
            between(i)
        if i == last:
            break


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


def _instrument(rec: HttpReceiver, tmp_path: Path, **extra: str) -> otelprof.instrumentation.Session:
    quiet = {"OTELPROF_TRIGGER_SIGNAL": "none", "OTELPROF_ANOMALY_FACTOR": "0", "OTELPROF_PROFILE_EARLY": "0"}
    return live_session.start(rec.port, tmp_path, **{"OTELPROF_RUN_ID": "windows", **quiet, **extra})


def _by_trace(rec: HttpReceiver) -> dict[bytes, list[Any]]:
    traces: dict[bytes, list[Any]] = {}
    for span in rec.spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def _profiled_steps(rec: HttpReceiver, steps: int = STEPS) -> list[int]:
    traces = _by_trace(rec)
    return [n for n in range(steps) if any(s.name.startswith("ProfilerStep#") for s in traces.get(_tid(n), []))]


def _tid(n: int) -> bytes:
    return ids.trace_id(f"step|windows|{n}")


def _triggers(rec: HttpReceiver) -> dict[int, tuple[str, str]]:
    """Step number -> (otelprof.step.window, otelprof.window.trigger) of the window's steps, as
    the receiver decoded their ``train.step`` spans."""
    out = {}
    for span in rec.spans:
        attrs = _attrs(span)
        if span.name == "train.step" and "otelprof.window.trigger" in attrs:
            out[attrs["otelprof.step.number"]] = (attrs["otelprof.step.window"], attrs["otelprof.window.trigger"])
    return out


def _marker_triggers(rec: HttpReceiver) -> dict[int, str]:
    """Step number -> ``otelprof.window.trigger`` of its converted ``ProfilerStep#N`` span."""
    return {
        int(s.name.split("#")[1]): _attrs(s).get("otelprof.window.trigger", "")
        for s in rec.spans
        if s.name.startswith("ProfilerStep#")
    }


def _window(first: int, recorded: int, trigger: str) -> dict[int, tuple[str, str]]:
    """A window's warmup step ``first`` and the ``recorded`` steps after it, marked by ``trigger``."""
    return {first: ("warmup", trigger), **{first + 1 + i: ("recorded", trigger) for i in range(recorded)}}


def test_schedule_profiles_exactly_the_active_steps(receiver: HttpReceiver, tmp_path: Path) -> None:
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "2", "OTELPROF_PROFILE_WAIT": "2", "OTELPROF_PROFILE_WARMUP": "1"}
    # every op a span of its own: this tiny model's aten::addmm runs near the default 10 us cut,
    # kept or not by how fast the machine is at that moment
    schedule["OTELPROF_MIN_DURATION_US"] = "0"
    session = _instrument(receiver, tmp_path, **schedule, OTELPROF_PROFILE_ACTIVE="2", OTELPROF_PROFILE_REPEAT="1")
    _train()
    live_session.stop(session)
    # skip 0-1, wait 2-3, warm up 4, record 5-6 (torch.profiler.schedule's semantics)
    assert _profiled_steps(receiver) == [5, 6]
    traces = _by_trace(receiver)
    for n in (5, 6):
        spans = traces[_tid(n)]
        names = {s.name for s in spans}
        assert {"train.step", f"ProfilerStep#{n}", "aten::linear", "aten::addmm", "Optimizer.step#SGD.step"} <= names
        by_id = {s.span_id: s for s in spans}
        addmm = next(s for s in spans if s.name == "aten::addmm" and s.parent_span_id)
        assert by_id[addmm.parent_span_id].name == "aten::linear"  # operator nesting
    step_spans = {"train.step", "data", "forward Sequential", "backward", "optimizer"}
    for n in (0, 4, 7, 9):  # unprofiled steps: the live step span and its phases only
        assert {s.name for s in traces[_tid(n)]} == step_spans
    metrics = _window_metrics(session)
    assert metrics["otelprof_profiling_windows_total"] == {
        "early": 0,
        "schedule": 1,
        "on_demand": 0,
        "anomaly": 0,
        "user": 0,
    }
    # the early window (warmup at step 10 by default) is left out: the schedule's first comes sooner
    assert _triggers(receiver) == _window(4, 2, "schedule")
    assert _marker_triggers(receiver) == {5: "schedule", 6: "schedule"}
    top = metrics["otelprof_window_op_self_cpu_seconds"]
    assert "aten::addmm" in top and 0 < len(top) <= 11 and all(v > 0 for v in top.values())
    assert "otelprof_window_gpu_busy_ratio" not in metrics  # a CPU run records no device time


def _window_metrics(session: otelprof.instrumentation.Session) -> dict[str, dict[str, float]]:
    """The session's window series after the run, by metric name and then by trigger/op label."""
    assert session.windows is not None and session.windows.metrics is not None
    registry = CollectorRegistry()
    registry.register(session.windows.metrics)
    out: dict[str, dict[str, float]] = {}
    for family in registry.collect():
        for sample in family.samples:
            key = sample.labels.get("trigger") or sample.labels.get("op") or ""
            out.setdefault(sample.name, {})[key] = sample.value
    return out


def test_trigger_file_profiles_the_next_steps(receiver: HttpReceiver, tmp_path: Path) -> None:
    trigger = tmp_path / "profile-now"
    env = {"OTELPROF_PROFILE_SKIP_FIRST": "999", "OTELPROF_TRIGGER_FILE": str(trigger), "OTELPROF_ON_DEMAND_STEPS": "2"}
    session = _instrument(receiver, tmp_path, **env)

    def touch_after_step_3(i: int) -> None:
        if i == 3:
            trigger.write_text("")

    _train(between=touch_after_step_3)
    live_session.stop(session)
    # seen at the next boundary (where step 4 begins): step 4 warms up, 5 and 6 are recorded
    assert _profiled_steps(receiver) == [5, 6]
    assert not trigger.exists()  # consumed
    assert session.windows is not None and session.windows.windows_done == 1
    assert session.windows._options.threads == 1  # a window's conversion leaves the other core to training
    assert _window_metrics(session)["otelprof_profiling_windows_total"]["on_demand"] == 1
    assert _triggers(receiver) == _window(4, 2, "on_demand")
    assert _marker_triggers(receiver) == {5: "on_demand", 6: "on_demand"}


def test_signal_profiles_the_next_steps(receiver: HttpReceiver, tmp_path: Path) -> None:
    import os
    import signal

    session = _instrument(receiver, tmp_path, OTELPROF_PROFILE_SKIP_FIRST="999", OTELPROF_TRIGGER_SIGNAL="SIGUSR2")
    handlers = []

    def signal_at_step_2(i: int) -> None:
        if i == 2:
            handlers.append(signal.getsignal(signal.SIGUSR2))  # ours, installed at the first step
            os.kill(os.getpid(), signal.SIGUSR2)

    _train(between=signal_at_step_2)
    live_session.stop(session)
    assert handlers[0] not in (signal.SIG_DFL, None)
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # restored
    assert _profiled_steps(receiver) == [4, 5]


def test_http_post_profiles_the_next_steps(receiver: HttpReceiver, tmp_path: Path) -> None:
    import json
    import urllib.error
    import urllib.request

    session = _instrument(receiver, tmp_path, OTELPROF_PROFILE_SKIP_FIRST="999")
    replies: list[tuple[int, dict[str, Any]]] = []

    def call(method: str, query: str = "") -> None:
        url = f"http://127.0.0.1:{session.metrics_port}/profile{query}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
                replies.append((r.status, json.load(r)))
        except urllib.error.HTTPError as e:
            replies.append((e.code, json.load(e)))

    def post_after_step_1(i: int) -> None:
        if i == 1:
            call("GET")
            call("POST", "?steps=0")
            call("POST", "?steps=3")

    _train(between=post_after_step_1)
    live_session.stop(session)
    assert [code for code, _ in replies] == [405, 400, 202]
    assert replies[2][1]["steps"] == 3
    # seen where step 2 begins: it warms up, and the three requested steps are recorded
    assert _profiled_steps(receiver) == [3, 4, 5]
    assert _window_metrics(session)["otelprof_profiling_windows_total"]["on_demand"] == 1
    assert _triggers(receiver) == _window(2, 3, "on_demand")


def test_a_slow_step_profiles_the_next_steps(receiver: HttpReceiver, tmp_path: Path) -> None:
    import time

    session = _instrument(receiver, tmp_path, OTELPROF_PROFILE_SKIP_FIRST="999", OTELPROF_ANOMALY_FACTOR="10")
    # every step sleeps 30 ms, so a scheduling hiccup of a loaded machine is not 10x the median;
    # step 12 sleeps 2 s: far over 10x the median of the twelve before it
    _train(steps=STEPS + 6, between=lambda i: time.sleep(2.0 if i == 12 else 0.03))
    live_session.stop(session)
    assert _profiled_steps(receiver, STEPS + 6) == [14, 15]
    windows = _window_metrics(session)["otelprof_profiling_windows_total"]
    assert windows == {"early": 0, "schedule": 0, "on_demand": 0, "anomaly": 1, "user": 0}
    assert _triggers(receiver) == _window(13, 2, "anomaly")
    assert _marker_triggers(receiver) == {14: "anomaly", 15: "anomaly"}


def test_the_first_window_is_early_by_default(receiver: HttpReceiver, tmp_path: Path) -> None:
    """A run shorter than the schedule's first window (step 511) is still profiled: once, right
    after a warm-up of 10 steps (the defaults: OTELPROF_PROFILE_EARLY=10, _ACTIVE=2)."""
    session = _instrument(receiver, tmp_path, OTELPROF_PROFILE_EARLY="")  # unset: the default
    _train(steps=16)
    live_session.stop(session)
    assert _profiled_steps(receiver, 16) == [11, 12]
    assert _triggers(receiver) == _window(10, 2, "early")
    assert _marker_triggers(receiver) == {11: "early", 12: "early"}
    after = next(s for s in receiver.spans if s.name == "train.step" and _attrs(s)["otelprof.step.number"] == 13)
    assert _attrs(after)["otelprof.step.window"] == "after" and "otelprof.window.trigger" not in _attrs(after)
    windows = _window_metrics(session)["otelprof_profiling_windows_total"]
    assert windows == {"early": 1, "schedule": 0, "on_demand": 0, "anomaly": 0, "user": 0}


def test_the_early_window_comes_before_the_schedule(receiver: HttpReceiver, tmp_path: Path) -> None:
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "6", "OTELPROF_PROFILE_WAIT": "0", "OTELPROF_PROFILE_REPEAT": "1"}
    session = _instrument(receiver, tmp_path, **schedule, OTELPROF_PROFILE_EARLY="2")
    _train(steps=12)
    live_session.stop(session)
    # early: warm up 2, record 3-4 (5 pays the stop); the schedule: skip 0-5, warm up 6, record 7-8
    assert _profiled_steps(receiver, 12) == [3, 4, 7, 8]
    assert _triggers(receiver) == {**_window(2, 2, "early"), **_window(6, 2, "schedule")}
    assert _marker_triggers(receiver) == {3: "early", 4: "early", 7: "schedule", 8: "schedule"}
    windows = _window_metrics(session)["otelprof_profiling_windows_total"]
    assert windows == {"early": 1, "schedule": 1, "on_demand": 0, "anomaly": 0, "user": 0}


@pytest.mark.parametrize("last", [None, STEPS - 2], ids=["loader-exhausted", "loop-breaks"])
def test_a_run_ending_inside_a_window_sends_no_orphan_step(
    receiver: HttpReceiver, tmp_path: Path, last: int | None
) -> None:
    """The window still records when the run ends (skip 2, wait 2, warm up 4, record from 5 on):
    its finished steps go under their ``train.step``; the ``ProfilerStep#N`` range of the step
    the run ended in (opened at the last boundary) has no train.step, and is not sent as a root
    trace of its own (counted)."""
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "2", "OTELPROF_PROFILE_WAIT": "2", "OTELPROF_PROFILE_ACTIVE": "50"}
    session = _instrument(receiver, tmp_path, **schedule, OTELPROF_PROFILE_REPEAT="1")
    _train(last=last)
    live_session.stop(session)
    updates = STEPS if last is None else last + 1
    spans = receiver.spans
    roots = [s.name for s in spans if not s.parent_span_id]
    assert sorted(roots) == ["train.step"] * updates
    known = {s.span_id for s in spans}  # and nothing of the dropped step is left behind
    assert [s.name for s in spans if s.parent_span_id and s.parent_span_id not in known] == []
    assert _profiled_steps(receiver) == list(range(5, updates))  # each under its train.step
    assert session.windows is not None and session.windows.conversions.unfinished_dropped == 1


def test_a_second_window_prints_no_torch_warning(
    receiver: HttpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduled window, then an on-demand one: torch's profiler warns nothing on the user's
    stderr, and no filter of otelprof's for it stays in the user's warning filters."""
    import importlib
    import warnings

    # torch warns once per process: as in a fresh one, whatever ran in this one before
    monkeypatch.setattr(importlib.import_module("torch.profiler.profiler"), "_WARNINGS_SHOWN", set())
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "2", "OTELPROF_PROFILE_WAIT": "2", "OTELPROF_PROFILE_ACTIVE": "2"}
    session = _instrument(receiver, tmp_path, **schedule, OTELPROF_PROFILE_REPEAT="1")

    def request_at_step_8(i: int) -> None:
        if i == 8:
            assert session.windows is not None
            session.windows.on_demand.request(2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(steps=14, between=request_at_step_8)
        live_session.stop(session)
        patterns = [f[1].pattern for f in warnings.filters if f[1] is not None]
        assert not [p for p in patterns if "Profiler clears events" in p]
    assert _profiled_steps(receiver, 14) == [5, 6, 10, 11]
    assert [str(w.message) for w in caught if "torch" in w.filename] == []


def _overlap(a: Any, b: Any) -> int:
    end: int = min(a.end_time_unix_nano, b.end_time_unix_nano)
    return end - int(max(a.start_time_unix_nano, b.start_time_unix_nano))


def _ancestors(span: Any, by_id: dict[bytes, Any]) -> list[Any]:
    chain = []
    while span.parent_span_id:
        span = by_id[span.parent_span_id]
        chain.append(span)
    return chain


@pytest.mark.parametrize("metrics", METRICS)
def test_a_profiled_step_has_one_root_with_operators_under_their_phases(
    receiver: HttpReceiver, tmp_path: Path, metrics: str
) -> None:
    """The window's operators hang under the live ``train.step``: ``ProfilerStep#N`` is its child,
    and each top-level operator sits under the phase span that ran it (by time). Steps stay in
    the native core, or (OTLP metrics) go through Python: the span ids come from either."""
    if "otlp" in metrics:
        pytest.importorskip("opentelemetry.sdk")
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "2", "OTELPROF_PROFILE_WAIT": "0", "OTELPROF_PROFILE_ACTIVE": "2"}
    env = {**schedule, "OTELPROF_PROFILE_REPEAT": "1", "OTEL_METRICS_EXPORTER": metrics}
    env["OTELPROF_MIN_DURATION_US"] = "0"  # every op: this tiny model's run near the 10 us cut
    session = _instrument(receiver, tmp_path, **env)
    _train(steps=8)
    assert (session.otlp_metrics is None) == (metrics == "prometheus")  # which path the steps took
    live_session.stop(session)
    traces = _by_trace(receiver)
    phases = {"data", "forward Sequential", "backward", "optimizer"}  # a forward names its module
    for n in (3, 4):
        spans = traces[_tid(n)]
        by_id = {s.span_id: s for s in spans}
        [root] = [s for s in spans if not s.parent_span_id]
        assert root.name == "train.step"
        [marker] = [s for s in spans if s.name == f"ProfilerStep#{n}"]
        assert marker.parent_span_id == root.span_id
        ops = [s for s in spans if s.name not in phases | {"train.step", marker.name}]
        assert len(ops) > 10
        under: dict[str, set[str]] = {}
        for op in ops:
            chain = _ancestors(op, by_id)
            assert chain[-1] is root, op.name  # every operator reaches train.step
            top = chain[-2]  # the span right under train.step: a phase or the ProfilerStep
            assert top.name in phases | {marker.name}, op.name
            under.setdefault(top.name, set()).add(op.name)
            parent = by_id[op.parent_span_id]
            overlaps = {p.span_id: _overlap(op, p) for p in spans if p.name in phases}
            if parent.name in phases and max(overlaps.values()) > 0:  # under the phase it overlaps most
                assert overlaps[parent.span_id] == max(overlaps.values()), op.name
            elif parent.name in phases:  # overlapping none (the loss): the phase that began last before it
                starts = sorted(p.start_time_unix_nano for p in spans if p.name in phases)
                before = [t for t in starts if t <= op.start_time_unix_nano]
                assert parent.start_time_unix_nano == (before[-1] if before else starts[0]), op.name
            assert parent is not marker, op.name
        assert {"aten::linear", "aten::addmm"} <= under["forward Sequential"]
        assert "Optimizer.step#SGD.step" in under["optimizer"]
        assert any("Backward" in name for name in under["backward"])
        assert any(name.startswith("enumerate(DataLoader)") for name in under["data"])


@pytest.mark.parametrize("metrics", METRICS)
def test_the_window_is_saved_off_the_training_thread_and_its_steps_are_marked(
    receiver: HttpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: str
) -> None:
    """Kineto writes the window's trace on the conversion thread, not the training thread; the
    warmup, recorded and following step are kept out of the slow-step median and marked on
    their spans; Kineto's stop at the boundary after the window is in no phase of the next step."""
    import threading

    from otelprof.capture.windows.profiling import Windows

    if "otlp" in metrics:
        pytest.importorskip("opentelemetry.sdk")
    costs: list[int] = []  # each window start's and stop's training-thread time, in order
    measured = Windows._overhead

    def recording(self: Windows, ns: int) -> None:
        costs.append(ns)
        measured(self, ns)

    monkeypatch.setattr(Windows, "_overhead", recording)
    off_thread = metrics == "prometheus"  # both saving places, one per step path
    monkeypatch.setattr("otelprof.capture.windows.profiling.SAVE_OFF_THREAD_MIN_CPUS", 1 if off_thread else 1 << 20)
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "2", "OTELPROF_PROFILE_WAIT": "0", "OTELPROF_PROFILE_ACTIVE": "2"}
    env = {
        **schedule,
        "OTELPROF_PROFILE_REPEAT": "1",
        "OTELPROF_ANOMALY_FACTOR": "1000",
        "OTEL_METRICS_EXPORTER": metrics,
    }
    session = _instrument(receiver, tmp_path, **env)
    _train(steps=8)
    assert (session.otlp_metrics is None) == (metrics == "prometheus")  # which path the steps took
    windows = session.windows  # made at the first step
    assert windows is not None
    anomaly = windows.anomaly
    live_session.stop(session)
    # saved in the background where cores are to spare, else in place (in no phase, as overhead)
    expected = "otelprof-windows" if off_thread else threading.current_thread().name
    assert windows.save_off_thread is off_thread
    assert list(windows.save_threads) == [expected]
    assert list(windows.marked_steps) == [2, 3, 4, 5]  # warmup, recorded, the step paying the stop
    assert anomaly.skipped == 4 and len(anomaly.history) == 8 - 4
    assert _profiled_steps(receiver, 8) == [3, 4]
    # Kineto's start (at steps 1|2, 2|3) and stop (4|5) on the training thread: counted, not hidden
    overhead = _window_metrics(session)["otelprof_profiling_window_overhead_seconds_total"][""]
    assert overhead == pytest.approx(windows.overhead_s) and overhead > 0
    assert sum(costs) / 1e9 == pytest.approx(overhead)
    stop = costs[-1]  # Kineto's stop at the 4|5 boundary (the fetch that begins step 5)
    marks = {2: "warmup", 3: "recorded", 4: "recorded", 5: "after"}
    for n in range(8):  # phases never sum past their step, the one after the window included
        spans = _by_trace(receiver)[_tid(n)]
        [step] = [s for s in spans if s.name == "train.step"]
        assert _attrs(step).get("otelprof.step.window") == marks.get(n), n
        phases = [s for s in spans if s.parent_span_id == step.span_id and not s.name.startswith("ProfilerStep#")]
        total = sum(s.end_time_unix_nano - s.start_time_unix_nano for s in phases)
        assert total <= step.end_time_unix_nano - step.start_time_unix_nano
        for p in phases:
            assert (
                step.start_time_unix_nano <= p.start_time_unix_nano <= p.end_time_unix_nano <= step.end_time_unix_nano
            )
        if n == 5:  # the stop ran between the step's start (the boundary) and its data phase
            [data] = [p for p in phases if p.name == "data"]
            assert data.start_time_unix_nano - step.start_time_unix_nano >= stop


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        field = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, field) if field else None
    return out


@pytest.mark.parametrize("metrics", METRICS)
def test_profiled_steps_follow_a_frameworks_own_numbers(receiver: HttpReceiver, tmp_path: Path, metrics: str) -> None:
    """A framework numbers steps itself, and only at their end (a resumed run, two optimizers per
    update): the profiler counts boundaries (skip 2, warm up 1, record 2), and each recorded
    ``ProfilerStep#`` still goes under the ``train.step`` it ran in, in that step's trace."""
    if "otlp" in metrics:
        pytest.importorskip("opentelemetry.sdk")
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "2", "OTELPROF_PROFILE_WAIT": "0", "OTELPROF_PROFILE_ACTIVE": "2"}
    env = {**schedule, "OTELPROF_PROFILE_REPEAT": "1", "OTEL_METRICS_EXPORTER": metrics}
    session = _instrument(receiver, tmp_path, **env)
    numbers = [100 + 2 * i for i in range(8)]  # the framework's: 100, 102, ... 114
    _train(steps=8, between=lambda i: otelprof.step(number=numbers[i]))
    live_session.stop(session)
    traces = _by_trace(receiver)
    profiled = {}
    for n in numbers:
        spans = traces.get(_tid(n), [])
        assert [s.name for s in spans if not s.parent_span_id] == ["train.step"], n
        markers = [s.name for s in spans if s.name.startswith("ProfilerStep#")]
        if markers:
            profiled[n] = markers
    # the schedule's own count: skip 2, warm up 1, record the 4th and 5th step, each in its trace
    assert profiled == {106: ["ProfilerStep#3"], 108: ["ProfilerStep#4"]}
    stray = [s.name for t, spans in traces.items() if t not in {_tid(n) for n in numbers} for s in spans]
    assert not [name for name in stray if name.startswith("ProfilerStep#")]


@pytest.mark.parametrize("metrics", ["prometheus", "prometheus,otlp"], ids=["native-steps", "python-steps"])
def test_a_profiled_steps_span_and_its_window_spans_share_one_resource(
    receiver: HttpReceiver, tmp_path: Path, metrics: str
) -> None:
    """The step span's resource equals the resource of the window spans of the same step
    (process.pid, local rank and telemetry.sdk.version on both), whichever path steps take."""
    if "otlp" in metrics:
        pytest.importorskip("opentelemetry.sdk")
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "2", "OTELPROF_PROFILE_WAIT": "0", "OTELPROF_PROFILE_ACTIVE": "2"}
    env = {**schedule, "OTELPROF_PROFILE_REPEAT": "1", "OTEL_METRICS_EXPORTER": metrics}
    session = _instrument(receiver, tmp_path, **env)
    _train(steps=8)
    live_session.stop(session)
    resources: dict[str, list[list[tuple[str, str, str]]]] = {"step": [], "window": []}
    for request in receiver.requests:
        for rs in request.resource_spans:
            attrs = [(kv.key, str(kv.value.WhichOneof("value")), str(kv.value)) for kv in rs.resource.attributes]
            for ss in rs.scope_spans:
                for span in ss.spans:
                    if span.trace_id == _tid(3) and span.name == "train.step":
                        resources["step"].append(attrs)
                    elif span.trace_id == _tid(3) and span.name.partition(" ")[0] not in PHASES:
                        resources["window"].append(attrs)  # ProfilerStep#3 and its operators
    [step] = resources["step"]
    assert resources["window"] and all(window == step for window in resources["window"])
    keys = {key for key, _kind, _value in step}
    assert {"process.pid", "otelprof.distributed.local_rank", "telemetry.sdk.version"} <= keys


def test_a_cuda_timed_profiled_step_keeps_its_window_under_it(
    receiver: HttpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA-timed steps wait in the native sink for their events, but their span ids are taken
    when they close: the window's ``ProfilerStep#N`` still hangs under the live ``train.step``."""
    from otelprof.capture import session as session_module
    from otelprof.capture.steps.device_timing import CpuEvent, DeviceTiming

    native_module()
    monkeypatch.setattr(session_module, "cuda_timing", lambda emit: DeviceTiming(emit, CpuEvent, lambda: True))
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "2", "OTELPROF_PROFILE_WAIT": "0", "OTELPROF_PROFILE_ACTIVE": "2"}
    session = _instrument(receiver, tmp_path, **schedule, OTELPROF_PROFILE_REPEAT="1")
    _train(steps=8)
    assert session.timing is not None and session._sink is not None  # the sink route
    live_session.stop(session)
    traces = _by_trace(receiver)
    assert _profiled_steps(receiver, 8) == [3, 4]
    for n in (3, 4):
        spans = traces[_tid(n)]
        [root] = [s for s in spans if not s.parent_span_id]
        assert root.name == "train.step"
        [marker] = [s for s in spans if s.name == f"ProfilerStep#{n}"]
        assert marker.parent_span_id == root.span_id
        step_phases = {s.span_id for s in spans if s.parent_span_id == root.span_id and s is not marker}
        assert len(step_phases) >= 3  # the live phase spans
        assert any(s.parent_span_id in step_phases for s in spans if s not in (root, marker))
