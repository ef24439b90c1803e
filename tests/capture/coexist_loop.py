"""A training loop whose user profiles it themselves, run bare or beside otelprof.

    python coexist_loop.py SCENARIO[,SCENARIO...] OUT_DIR [--otelprof] [--repeat N]

Prints one JSON object: what the user's own profiler recorded (events by name and count, not
times), which the tests compare between the bare run and the run beside otelprof, and with
--otelprof, what otelprof's windows did. otelprof's windows are frequent (one recorded step
in every three), so they meet the user's profiler in every scenario.
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import KinetoStepTracker
from torch.profiler import profile, schedule

STEPS = 12
WINDOWS_EVERY_THIRD_STEP = {
    "OTELPROF_PROFILE_SKIP_FIRST": "0",
    "OTELPROF_PROFILE_WAIT": "1",
    "OTELPROF_PROFILE_WARMUP": "1",
    "OTELPROF_PROFILE_ACTIVE": "1",
    "OTELPROF_PROFILE_EARLY": "0",
    "OTELPROF_TRIGGER_SIGNAL": "none",
    "OTELPROF_ANOMALY_FACTOR": "0",
    "OTELPROF_MIN_DURATION_US": "0",
}


class Loop:
    """A tiny model trained from a DataLoader; ``run(on_step)`` calls ``on_step(i)`` after each
    step's update."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.randn(STEPS * 4, 16)), batch_size=4
        )

    def run(self, on_step: Any = None, steps: int = STEPS) -> None:
        for i, (batch,) in enumerate(self.loader):
            if i >= steps:
                break
            self.model(batch).pow(2).mean().backward()
            self.opt.step()
            self.opt.zero_grad()
            if on_step is not None:
                on_step(i)


def trace_summary(path: Path) -> dict[str, Any]:
    """A saved Chrome trace's events by name and count (python_function frames apart: they are
    the interpreter's own, counted per thread)."""
    events = json.loads(path.read_text())["traceEvents"]
    names = collections.Counter(
        e["name"] for e in events if e.get("ph") == "X" and e.get("cat") not in ("python_function", "Trace")
    )
    python_threads = {e["tid"] for e in events if e.get("cat") == "python_function"}
    return {"names": dict(sorted(names.items())), "python_threads": len(python_threads)}


#: key_averages() rows of with_stack's Python frames: every Python call in the process, otelprof's
#: hooks and threads included, as any library's would be
_PYTHON_FRAME = re.compile(r"^<|\.py\(\d+\): ")


def table(prof: Any) -> dict[str, int]:
    """key_averages(): rows by name and call count (Python frames apart)."""
    return {row.key: row.count for row in prof.key_averages() if not _PYTHON_FRAME.search(row.key)}


def in_window() -> bool:
    """Beside otelprof: whether the running step is recorded by one of its windows (the user's
    profiler then starts in the middle of otelprof's window); bare: always."""
    import otelprof.capture.session as live

    session = live._session
    if session is None or session.windows is None:
        return True
    return (session.windows.mark() or "").startswith("recorded")


def plain(loop: Loop, out: Path) -> dict[str, Any]:
    """``with torch.profiler.profile(...)`` around a few steps, started while training."""
    result: dict[str, Any] = {}

    def on_step(i: int) -> None:
        if "trace" in result or not in_window():
            return
        with profile(record_shapes=True, profile_memory=True, with_stack=True) as prof:
            loop.run(steps=4)
        prof.export_chrome_trace(str(out / "plain.json"))
        result["trace"] = trace_summary(out / "plain.json")
        result["table"] = table(prof)

    loop.run(on_step)
    return result


def scheduled(loop: Loop, out: Path) -> dict[str, Any]:
    """A scheduled profiler with ``tensorboard_trace_handler``, stepped by the user; two cycles."""
    logdir = out / "tb"
    sched = schedule(wait=1, warmup=1, active=2, repeat=2)
    with profile(schedule=sched, on_trace_ready=torch.profiler.tensorboard_trace_handler(str(logdir))) as prof:
        loop.run(lambda _i: prof.step())
    traces = sorted(logdir.glob("*.json"))
    return {"traces": [trace_summary(p) for p in traces], "table": table(prof)}


def steppers(loop: Loop, out: Path) -> dict[str, Any]:
    """torch's step tracker counts the user's profiler steps and nothing of otelprof's."""
    before = KinetoStepTracker.current_step()
    with profile(schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        loop.run(lambda _i: prof.step())
    return {"tracker_steps": KinetoStepTracker.current_step() - before, "table": table(prof)}


def execution_trace(loop: Loop, out: Path) -> dict[str, Any]:
    """An ExecutionTraceObserver beside Kineto: its nodes join Kineto's ops by record-function id."""
    from torch.profiler import ExecutionTraceObserver

    et_path = out / "et.json"
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    with profile(execution_trace_observer=observer) as prof:
        loop.run(steps=3)
    observer.unregister_callback()
    prof.export_chrome_trace(str(out / "kineto.json"))
    nodes = json.loads(et_path.read_text())["nodes"]
    et_ids = {n["attrs"][0]["value"]: n["name"] for n in nodes if n.get("attrs") and n["attrs"][0]["name"] == "rf_id"}
    if not et_ids:  # older layouts keep rf_id elsewhere
        et_ids = {a["value"]: n["name"] for n in nodes for a in n.get("attrs", []) if a.get("name") == "rf_id"}
    events = json.loads((out / "kineto.json").read_text())["traceEvents"]
    kineto = {
        e["args"]["Record function id"]: e["name"]
        for e in events
        if e.get("cat") == "cpu_op" and "Record function id" in e.get("args", {})
    }
    joined = [rf for rf, name in kineto.items() if et_ids.get(rf) == name]
    return {
        "et_nodes": dict(sorted(collections.Counter(n["name"] for n in nodes).items())),
        "kineto_ops": len(kineto),
        "joined": len(joined),
        "trace": trace_summary(out / "kineto.json"),
    }


def memory_timeline(loop: Loop, out: Path) -> dict[str, Any]:
    """``export_memory_timeline``: the same allocations and frees, by kind, size and category
    (its sampled points merge events that share a microsecond, so their number varies bare)."""
    with profile(record_shapes=True, profile_memory=True, with_stack=True) as prof:
        loop.run(steps=3)
    path = out / "memory.json"
    prof.export_memory_timeline(str(path))
    times, sizes = json.loads(path.read_text())
    profile_ = prof._memory_profile()
    events = collections.Counter(
        f"{action.name} {size} {profile_._categories.get(key, version)}"
        for _t, action, (key, version), size in profile_.timeline
    )
    return {"events": dict(sorted(events.items())), "peak": max(map(sum, sizes)), "exported": len(times) > 0}


def itt(loop: Loop, out: Path) -> dict[str, Any]:
    """``emit_itt`` (the CPU's counterpart of emit_nvtx) around a few steps."""
    steps: list[int] = []
    with torch.autograd.profiler.emit_itt():
        loop.run(steps.append, steps=4)
    return {"steps": len(steps), "still_enabled": torch.autograd.profiler._is_profiler_enabled}


def legacy(loop: Loop, out: Path) -> dict[str, Any]:
    """The autograd profiler (``torch.autograd.profiler.profile``) around a few steps."""
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        loop.run(steps=4)
    return {"table": {e.key: e.count for e in prof.key_averages()}}


SCENARIOS = {f.__name__: f for f in (plain, scheduled, steppers, execution_trace, memory_timeline, itt, legacy)}


def main() -> None:
    scenarios, out = sys.argv[1].split(","), Path(sys.argv[2])
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    session = None
    if "--otelprof" in sys.argv:
        import logging

        import otelprof

        logging.basicConfig(level=logging.INFO)

        environ = {
            **os.environ,
            **WINDOWS_EVERY_THIRD_STEP,
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",  # nothing listens: spooled
            "OTELPROF_SPOOL_DIR": str(out / "spool"),
            "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        }
        session = otelprof.instrument(environ=environ)
    results: dict[str, list[Any]] = {}
    for k in range(repeat):
        for scenario in scenarios:
            run_dir = out / f"{scenario}-{k}"
            run_dir.mkdir(parents=True, exist_ok=True)
            loop = Loop()
            loop.run(steps=4)  # otelprof's windows are running by now
            results.setdefault(scenario, []).append(SCENARIOS[scenario](loop, run_dir))
    report: dict[str, Any] = {"results": results}
    if session is not None:
        windows = session.windows
        assert windows is not None
        assert windows.metrics is not None
        skipped = [
            sample.value
            for family in windows.metrics.collect()
            for sample in family.samples
            if sample.name == "otelprof_windows_skipped_total" and sample.labels["reason"] == "user_profiler"
        ]
        report["otelprof"] = {
            "windows_done": windows.windows_done,
            "windows_skipped": windows.windows_skipped,
            "windows_failed": windows.windows_failed,
            "skipped_metric": skipped[0],
        }
        import otelprof

        otelprof.uninstrument()
        report["otelprof"]["windows_done"] = windows.windows_done  # after the last conversions
    print(json.dumps(report, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
