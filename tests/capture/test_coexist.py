"""otelprof beside the user's own profiler: what the user records is the same with and without
otelprof, and otelprof's windows give way (skipped, counted), with no crash under glibc's
malloc checks. Each run is a process of its own (coexist_loop.py), as a user's job would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

LOOP = Path(__file__).with_name("coexist_loop.py")
SCENARIOS = ("plain", "scheduled", "steppers", "execution_trace", "memory_timeline", "itt", "legacy")
REPEAT = 2  # each scenario twice in one process: a second profiler after the first


def _run(scenarios: tuple[str, ...], out: Path, *flags: str, **env: str) -> dict[str, Any]:
    environ = {**os.environ, "MALLOC_CHECK_": "3", "OTELPROF_CUDA_EVENTS": "false", **env}
    args = [sys.executable, str(LOOP), ",".join(scenarios), str(out), "--repeat", str(REPEAT), *flags]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=environ)
    assert proc.returncode == 0, proc.stderr[-4000:]  # no crash, at exit included
    report: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    report["stderr"] = proc.stderr
    return report


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    bare = _run(SCENARIOS, tmp_path_factory.mktemp("bare"))
    beside = _run(SCENARIOS, tmp_path_factory.mktemp("beside"), "--otelprof")
    return bare, beside


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_users_profile_is_the_same_beside_otelprof(
    runs: tuple[dict[str, Any], dict[str, Any]], scenario: str
) -> None:
    bare, beside = runs
    assert beside["results"][scenario] == bare["results"][scenario]
    assert len(bare["results"][scenario]) == REPEAT


def test_otelprofs_windows_gave_way_and_were_counted(runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _bare, beside = runs
    windows = beside["otelprof"]
    # every user profiler met a window due or running: at least one skip for each, none failed
    assert windows["windows_skipped"] >= len(SCENARIOS) * REPEAT
    assert windows["windows_failed"] == 0
    assert windows["windows_done"] >= 1  # between the user's profilers, otelprof's windows ran
    assert windows["skipped_metric"] == windows["windows_skipped"]
    assert "Traceback" not in beside["stderr"]
    assert "Profiler is already enabled" not in beside["stderr"]
    assert beside["stderr"].count("give way") == 1  # logged once


def test_scenarios_record_what_they_claim(runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """The comparisons above compare something: the user's data is there, bare."""
    bare, _beside = runs
    results = bare["results"]
    for plain in results["plain"]:
        assert plain["table"]["aten::addmm"] == 8 and "ProfilerStep*" not in plain["table"]
        assert plain["trace"]["names"]["Optimizer.step#SGD.step"] == 4
    for scheduled in results["scheduled"]:
        # two cycles of wait 1, warmup 1, active 2: two traces with two ProfilerStep ranges each
        assert len(scheduled["traces"]) == 2
        for trace in scheduled["traces"]:
            assert sum(n for name, n in trace["names"].items() if name.startswith("ProfilerStep#")) == 2
    # torch counts steps for its daemon only (KINETO_USE_DAEMON): nothing here moved its tracker
    assert [r["tracker_steps"] for r in results["steppers"]] == [0] * REPEAT
    for et in results["execution_trace"]:
        assert et["kineto_ops"] > 50 and et["joined"] == et["kineto_ops"]  # every op joins by rf id
    for timeline in results["memory_timeline"]:
        assert timeline["exported"] and timeline["peak"] > 0 and timeline["events"]
    assert [r["steps"] for r in results["itt"]] == [4] * REPEAT


def test_a_child_under_kineto_daemon_is_left_alone(tmp_path: Path) -> None:
    """With KINETO_USE_DAEMON=1 on-demand tracing may start at any time: otelprof records no
    window at all, and torch's step tracker counts only the user's steps."""
    scenarios = ("steppers", "scheduled")
    bare = _run(scenarios, tmp_path / "bare", KINETO_USE_DAEMON="1")
    beside = _run(scenarios, tmp_path / "beside", "--otelprof", KINETO_USE_DAEMON="1")
    assert beside["results"] == bare["results"]
    # the user's 12 profiler steps, and no step of otelprof's
    assert [r["tracker_steps"] for r in bare["results"]["steppers"]] == [12] * REPEAT
    assert beside["otelprof"]["windows_done"] == 0 and beside["otelprof"]["windows_skipped"] >= 1


# --- in this process: slow-step triggers, threads, imports --------------------------------------


def _train(steps: int, on_step: Any = None) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 4, 16))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (batch,) in enumerate(torch.utils.data.DataLoader(data, batch_size=4)):
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if on_step is not None:
            on_step(i)


def test_steps_the_users_profiler_slowed_start_no_anomaly_window(tmp_path: Path) -> None:
    """A user profiling steps 12-14 makes them far slower than the median: no slow-step window,
    and those steps stay out of the median."""
    import time

    import torch
    from export.receivers import http_receiver

    from capture import live_session

    quiet = {"OTELPROF_TRIGGER_SIGNAL": "none", "OTELPROF_PROFILE_EARLY": "0", "OTELPROF_PROFILE_SKIP_FIRST": "999"}
    with http_receiver() as receiver:
        session = live_session.start(receiver.port, tmp_path, **quiet, OTELPROF_ANOMALY_FACTOR="3")
        prof = torch.profiler.profile(with_stack=True, record_shapes=True)

        def on_step(i: int) -> None:
            if i == 11:
                prof.__enter__()
            if 12 <= i <= 14:
                time.sleep(0.5)  # far over 3x the median of the steps before
            if i == 14:
                prof.__exit__(None, None, None)
            time.sleep(0.01)

        _train(20, on_step)
        windows = session.windows
        assert windows is not None
        live_session.stop(session)
    assert windows.windows_done == 0 and windows.windows_skipped == 0  # none was due
    assert windows.anomaly.skipped >= 3  # the user's profiled steps: out of the median
    assert max(windows.anomaly.history) < 0.3
    assert len(prof.key_averages()) > 10  # the user's profile is there


def test_no_thread_before_one_is_needed(tmp_path: Path) -> None:
    """Instrumenting starts no thread; the first step starts the exporter, step-span and
    /metrics threads; the window-conversion thread waits for a window."""
    import threading

    from export.receivers import http_receiver

    from capture import live_session

    def ours() -> set[str]:
        return {t.name for t in threading.enumerate() if t.name.startswith("otelprof")}

    quiet = {"OTELPROF_TRIGGER_SIGNAL": "none", "OTELPROF_PROFILE_EARLY": "0", "OTELPROF_PROFILE_SKIP_FIRST": "999"}
    with http_receiver() as receiver:
        before = ours()
        session = live_session.start(receiver.port, tmp_path, **quiet)
        instrumented = ours() - before
        _train(4)
        trained = ours() - before
        live_session.stop(session)
    assert instrumented <= {"otelprof-exporter"}  # the test's own exporter, made before instrument()
    assert trained == {"otelprof-exporter", "otelprof-step-spans", "otelprof-metrics"}


def test_a_failed_import_is_tried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without opentelemetry the application's current span is looked up once, not per step."""
    import builtins

    from otelprof.capture.spans import step_spans

    monkeypatch.setattr(step_spans, "_otel", None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import raises ImportError
    tries = []
    real_import = builtins.__import__

    def counting(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry"):
            tries.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", counting)
    assert [step_spans.current_parent() for _ in range(100)] == [None] * 100
    assert tries == ["opentelemetry"]


def test_a_profiler_made_before_instrumenting_is_given_way_too(tmp_path: Path) -> None:
    """The user's scheduled profiler exists before otelprof instruments the process (its step
    range is open, unseen by the wrappers): otelprof records no window while it lives, and the
    user's trace has the steps it would have had."""
    import torch
    from export.receivers import http_receiver

    from capture import live_session

    every_third = {"OTELPROF_PROFILE_SKIP_FIRST": "0", "OTELPROF_PROFILE_WAIT": "1", "OTELPROF_PROFILE_WARMUP": "1"}
    env = {**every_third, "OTELPROF_PROFILE_ACTIVE": "1", "OTELPROF_PROFILE_EARLY": "0"}
    traces: list[Any] = []
    schedule = torch.profiler.schedule(wait=2, warmup=1, active=2, repeat=1)
    with http_receiver() as receiver:
        with torch.profiler.profile(schedule=schedule, on_trace_ready=traces.append) as prof:
            session = live_session.start(receiver.port, tmp_path, OTELPROF_TRIGGER_SIGNAL="none", **env)
            _train(9, lambda _i: prof.step())
            windows = session.windows
            assert windows is not None
            live_session.stop(session)
        spans = list(receiver.spans)
    assert windows.windows_done == 0 and windows.windows_skipped >= 3  # one due every third step
    assert not [s for s in spans if s.name.startswith("ProfilerStep#")]
    [trace] = traces
    steps = [e for e in trace.events() if e.name.startswith("ProfilerStep")]  # torch names them ProfilerStep*
    assert len(steps) == 2 and min(e.time_range.start for e in steps) > 0


def test_root_discovery_steps_out_of_a_with_stack_profile(tmp_path: Path) -> None:
    """Before the first step otelprof finds the root modules with global module hooks (Python
    frames around every module call): they come out while the user's with_stack profile runs,
    and discovery goes on after it (the steps after it have their forward phase)."""
    import torch
    from export.receivers import http_receiver

    from capture import live_session

    quiet = {"OTELPROF_TRIGGER_SIGNAL": "none", "OTELPROF_PROFILE_EARLY": "0", "OTELPROF_PROFILE_SKIP_FIRST": "999"}
    with http_receiver() as receiver:
        session = live_session.start(receiver.port, tmp_path, **quiet)
        forward = session.hooks.forward
        assert forward is not None and forward.discovering
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        with torch.profiler.profile(with_stack=True) as prof:
            hooks_inside = list(forward._global)  # out while the user's profile runs
            model(torch.randn(2, 4))
        assert hooks_inside == []
        discoveries = forward.discoveries
        _train(4)
        assert forward.discoveries == discoveries + 1 and not forward.discovering  # resumed, found
        live_session.stop(session)
    # (the test's own exporter thread, made before instrument(), is not otelprof's to pause)
    frames = [e.name for e in prof.events() if "otelprof/capture" in e.name]
    assert frames == []
    assert "torch/nn/modules/module.py(1782): _call_impl" in {e.name for e in prof.events()}
    phases = {s.name for s in receiver.spans}
    assert "forward Sequential" in phases


def test_uninstrument_puts_torchs_profiler_entry_points_back(tmp_path: Path) -> None:
    import torch
    import torch.autograd.profiler as autograd_profiler
    from export.receivers import http_receiver
    from torch.profiler.profiler import ExecutionTraceObserver

    from capture import live_session

    entry_points = [
        (torch.profiler.profile, "__init__"),
        (autograd_profiler.profile, "_prepare_trace"),
        (autograd_profiler, "_run_on_profiler_start"),
        (ExecutionTraceObserver, "register_callback"),
    ]
    before = [vars(owner)[name] for owner, name in entry_points]
    with http_receiver() as receiver:
        session = live_session.start(receiver.port, tmp_path, OTELPROF_TRIGGER_SIGNAL="none")
        wrapped = [vars(owner)[name] for owner, name in entry_points]
        live_session.stop(session)
    assert all(w is not b for w, b in zip(wrapped, before, strict=True))  # otelprof was watching
    assert [vars(owner)[name] for owner, name in entry_points] == before


def test_torchs_lazy_profiler_modules_are_imported_before_any_profile() -> None:
    """torch imports these inside the first profile it starts, and its Python tracer then reads
    a code object the import freed (UnicodeDecodeError in a with_stack profile's events(), about
    1 first profile in 2 bare): a fresh process under otelprof has them before any profile."""
    from otelprof.capture.coexist import LAZY_MODULES

    script = (
        "import sys, torch, otelprof\n"
        "otelprof.instrument(environ={'OTEL_EXPORTER_PROMETHEUS_PORT': '0'})\n"
        f"print([m in sys.modules for m in {LAZY_MODULES!r}])\n"
        "otelprof.uninstrument()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([True] * len(LAZY_MODULES))


FIRST_STEP_INSIDE = """
import sys, torch, otelprof
from torch.profiler import profile
lin = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(lin.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
x = torch.randn(2, 4, requires_grad=True)
lin.weight.grad = torch.zeros_like(lin.weight)
opt.step()  # torch's own first-step imports (dynamo...), bare as well, before otelprof
extra = dict(e.split("=", 1) for e in sys.argv[3:])
otelprof.instrument(environ={"OTEL_EXPORTER_PROMETHEUS_PORT": "0", "OTELPROF_SPOOL_DIR": sys.argv[2], **extra})
before = set(sys.modules)
with profile(with_stack=True) as prof:
    if sys.argv[1] == "backward":
        (x * 2).sum().backward()
    elif sys.argv[1] == "dataloader":
        next(iter(loader))
    else:
        opt.step()
print("imported:", sorted(set(sys.modules) - before), len(prof.events()) > 0)
otelprof.uninstrument()
"""


@pytest.mark.parametrize("first", ["backward", "dataloader", "optimizer"])
@pytest.mark.parametrize(
    "extra",
    [(), ("OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=0.5", "OTEL_TRACES_EXPORTER=otlp,console")],
    ids=["default", "sampler-and-sdk-exporter"],
)
def test_otelprofs_first_step_inside_a_with_stack_profile_imports_nothing(
    tmp_path: Path, first: str, extra: tuple[str, ...]
) -> None:
    """otelprof's session starts at the first step: when that is inside the user's with_stack
    profile, it imports nothing there (torch's Python tracer would keep pointers into the freed
    module code, and the user's events() raise UnicodeDecodeError), whatever the trace route
    (a sampler and SDK exporters are imported at instrument())."""
    args = [sys.executable, "-c", FIRST_STEP_INSIDE, first, str(tmp_path), *extra]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [result] = [line for line in proc.stdout.splitlines() if line.startswith("imported:")]  # (console spans too)
    assert result == "imported: [] True"
