"""``otelprof.trace_handler()``: a user's own scheduled torch.profiler, sent to a real OTLP receiver.

Beside the auto-instrumentor each of the user's ``ProfilerStep#K`` lands under the live
``train.step`` it ran in (the user's K is not otelprof's step number: matched by time), with
the same spans ``otelprof convert`` makes of the same window; the user's own trace file is
written as it would be without otelprof. Without a session the handler exports on its own."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from export.receivers import HttpReceiver, http_receiver
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import otelprof
from capture import live_session
from otelprof.otlp import ids

torch = pytest.importorskip("torch")

STEPS = 8
#: the user's schedule: ProfilerStep#0 waits, #1 warms up, #2 and #3 are recorded
USER_SCHEDULE = {"wait": 1, "warmup": 1, "active": 2, "repeat": 1}


def _train(on_step: Any) -> None:
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(STEPS * 4, 16)), batch_size=4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (batch,) in loader:
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        on_step()


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


def _attrs(span: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value") or "string_value") for kv in span.attributes}


def _shape(spans: Any) -> collections.Counter[tuple[str, int, int]]:
    """Spans by name and times: what a window's conversion made, whoever parents them."""
    return collections.Counter((s.name, s.start_time_unix_nano, s.end_time_unix_nano) for s in spans)


def test_the_users_window_goes_under_the_live_steps_it_ran_in(receiver: HttpReceiver, tmp_path: Path) -> None:
    quiet = {"OTELPROF_TRIGGER_SIGNAL": "none", "OTELPROF_ANOMALY_FACTOR": "0", "OTELPROF_PROFILE_EARLY": "0"}
    env = {**quiet, "OTELPROF_PROFILE_SKIP_FIRST": "999", "OTELPROF_RUN_ID": "handler"}
    session = live_session.start(receiver.port, tmp_path / "spool", **env)
    logdir = tmp_path / "tb"
    handler = otelprof.trace_handler(then=torch.profiler.tensorboard_trace_handler(str(logdir)))
    schedule = torch.profiler.schedule(**USER_SCHEDULE)
    with torch.profiler.profile(schedule=schedule, on_trace_ready=handler) as prof:
        _train(prof.step)
    windows = session.windows
    assert windows is not None
    live_session.stop(session)

    [user_file] = logdir.glob("*.json")  # the user's own trace, as tensorboard_trace_handler wrote it
    events = json.loads(user_file.read_text())["traceEvents"]
    assert sorted(e["name"] for e in events if e["name"].startswith("ProfilerStep#")) == [
        "ProfilerStep#2",
        "ProfilerStep#3",
    ]
    assert not [e for e in events if "otelprof" in json.dumps(e)]

    by_id = {s.span_id: s for s in receiver.spans}
    steps = {_attrs(s)["otelprof.step.number"]: s for s in receiver.spans if s.name == "train.step"}
    assert sorted(steps) == list(range(STEPS))
    for k in (2, 3):  # the live step that ran the user's step k: the loop's k-th iteration
        [marker] = [s for s in receiver.spans if s.name == f"ProfilerStep#{k}"]
        live = steps[k]
        assert marker.parent_span_id == live.span_id and marker.trace_id == live.trace_id
        assert live.trace_id == ids.trace_id(f"step|handler|{k}")
        assert _attrs(marker)["otelprof.window.trigger"] == "user"
        ops = [s for s in receiver.spans if s.trace_id == live.trace_id and s.name.startswith("aten::addmm")]
        assert ops  # the user's operators, in that step's trace, under its phases
        for op in ops:
            chain = []
            span = op
            while span.parent_span_id:
                span = by_id[span.parent_span_id]
                chain.append(span.name)
            assert chain[-1] == "train.step" and "forward Sequential" in chain

    # the same spans as `otelprof convert` of the user's file (only their parents differ)
    converted = otelprof.convert(user_file, options=otelprof.ConvertOptions(run_id="handler"))
    spans = [
        s
        for request in converted.requests
        for rs in ExportTraceServiceRequest.FromString(request).resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    live_names = {"train.step", "data", "forward Sequential", "backward", "optimizer"}
    sent = [s for s in receiver.spans if s.name not in live_names and not s.name.startswith("ProfilerStep#")]
    alone = [s for s in spans if not s.name.startswith("ProfilerStep#")]
    assert _shape(sent) == _shape(alone) and len(alone) > 20
    for k in (2, 3):  # a marker begins at the user's prof.step(), before its live step: cut to the step
        [marker] = [s for s in receiver.spans if s.name == f"ProfilerStep#{k}"]
        live = steps[k]
        assert live.start_time_unix_nano <= marker.start_time_unix_nano <= marker.end_time_unix_nano
        assert marker.end_time_unix_nano <= live.end_time_unix_nano
    assert windows.windows_done == 1 and windows.windows_failed == 0
    assert windows.metrics is not None and windows.metrics.snapshot()[0]["user"] == 1


SCRIPT = """
import torch, otelprof
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
with torch.profiler.profile(
    schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1), on_trace_ready=otelprof.trace_handler()
) as prof:
    for _ in range(4):
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
print("done", flush=True)
"""


def test_without_a_session_the_handler_exports_on_its_own(receiver: HttpReceiver, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
        "OTELPROF_RUN_ID": "alone",
        "OTELPROF_MIN_DURATION_US": "0",  # this tiny model's ops are shorter than the default cut
    }
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    names = collections.Counter(s.name for s in receiver.spans)
    assert names["ProfilerStep#1"] == 1 and names["ProfilerStep#2"] == 1 and names["aten::addmm"] >= 2
    markers = [s for s in receiver.spans if s.name.startswith("ProfilerStep#")]
    assert all(not s.parent_span_id for s in markers)  # no live step to go under: each its step's root
    assert {s.trace_id for s in markers} == {ids.trace_id("step|alone|1"), ids.trace_id("step|alone|2")}
