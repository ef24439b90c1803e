"""Memory by category from a profiling window (capture/memory/): a real training loop whose
parameter, optimizer-state, gradient, input and activation sizes are known by construction,
recorded by a window with ``profile_memory``; the memory spans and metrics the receiver and a
scrape get are checked against that construction and against torch's own
``export_memory_timeline`` of the same profile (the oracle).

The CPU allocator's rounding, measured: none. torch's memory profiler records each allocation's
requested size (c10's CPU allocator aligns addresses to 64 bytes but reports ``nbytes``), so a
category's bytes are the construction's exactly (Adam's two 4-byte ``step`` scalars included)."""

from __future__ import annotations

import bisect
import json
import logging
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pytest
from export.receivers import HttpReceiver, http_receiver, wait_until

from capture import live_session
from otelprof.capture.memory import oom, timeline
from otelprof.capture.windows import profiling
from otelprof.converter import LiveStep
from otelprof.otlp import conventions, ids

torch = pytest.importorskip("torch")

B, DIN, H, DOUT = 64, 256, 512, 128  # batch, input, hidden, output: hidden dominates
F32 = 4
PARAMS = F32 * (DIN * H + H * DOUT)  # two Linear layers without bias
STEP_SCALARS = 2 * F32  # Adam keeps a float32 `step` tensor per parameter on the CPU
STEPS = 6
RECORDED = (3, 4)  # skip 2, warm up step 2, record 3 and 4
RUN = "memory"
SCHEDULE = {
    "OTELPROF_RUN_ID": RUN,
    **live_session.ONE_WINDOW,
}


def _train(steps: int = STEPS) -> None:
    """Each step makes its batch, runs Linear-ReLU-Linear and a fused Adam update. Fused: the
    for-loop Adam's temporaries (``denom``) are labelled parameter by torch's data flow in some
    steps, which would put a weight's size on the parameter peak."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(DIN, H, bias=False), torch.nn.ReLU(), torch.nn.Linear(H, DOUT, bias=False)
    )
    opt = torch.optim.Adam(model.parameters(), fused=True)
    for _ in range(steps):
        x, y = torch.randn(B, DIN), torch.randn(B, DOUT)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        del x, y  # one batch alive at a time


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in kvs}


def _scrape(port: int | None) -> dict[str, dict[tuple[str, ...], float]]:
    """The session's /metrics over HTTP: window memory series by (device[, category])."""
    assert port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for line in text.splitlines():
        if line.startswith("otelprof_window_memory"):
            name, _, rest = line.partition("{")
            labels, _, value = rest.rpartition("} ")
            pairs = dict(p.split("=", 1) for p in labels.split(","))
            key = tuple(pairs[k].strip('"') for k in ("device", "category") if k in pairs)
            out.setdefault(name, {})[key] = float(value)
    return out


def _torch_rows(prof: Any, results: Any, path: Path) -> tuple[list[int], list[list[int]]]:
    """torch's export_memory_timeline of the window's own profile: [times us, rows by category]."""
    prof.profiler.kineto_results = results  # detached where the trace is saved off-thread
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the export
        prof.export_memory_timeline(str(path), "cpu")
    times, sizes = json.loads(path.read_text())
    return times, [row[1:] for row in sizes]  # torch's first slot is unused


def _row(times: list[int], rows: list[list[int]], t_ns: int) -> list[int]:
    return rows[max(0, bisect.bisect_right(times, t_ns // 1000) - 1)]


def _by_category(attrs: dict[str, Any], suffix: str) -> dict[str, int]:
    return {c: attrs[f"otelprof.memory.{c}.{suffix}"] for c in conventions.MEMORY_CATEGORIES}


def _capture_profiles(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The window's torch profiler and results as profiling.py hands them over, for torch's own
    export afterwards (the results are detached from the profiler on many-core machines)."""
    captured: dict[str, Any] = {}
    ready = profiling.Windows._ready

    def keep(self: Any, prof: Any, *args: Any, **kwargs: Any) -> None:
        captured["prof"], captured["results"] = prof, prof.profiler.kineto_results
        ready(self, prof, *args, **kwargs)

    monkeypatch.setattr(profiling.Windows, "_ready", keep)
    return captured


METRICS = [
    pytest.param("prometheus", id="native-steps"),
    pytest.param("prometheus,otlp", id="python-steps"),  # OTLP metrics put steps on the Python route
]


@pytest.mark.parametrize("exporters", METRICS)
def test_memory_by_category_matches_construction_and_torchs_timeline(
    exporters: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    captured = _capture_profiles(monkeypatch)
    env = {**SCHEDULE, "OTELPROF_PROFILE_OPTIONS": "profile_memory", "OTEL_METRICS_EXPORTER": exporters}
    with http_receiver() as rec:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{rec.port}")  # the SDK reads it
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "60000")  # only the export at shutdown
        session = live_session.start(rec.port, tmp_path / "spool", **env)
        _train()
        windows = session.windows
        assert windows is not None
        wait_until(lambda: windows.windows_done == 1)
        scraped = _scrape(session.metrics_port)
        live_session.stop(session)
    times, rows = _torch_rows(captured["prof"], captured["results"], tmp_path / "timeline.json")
    categories = conventions.MEMORY_CATEGORIES
    peaks = {c: max(row[i] for row in rows) for i, c in enumerate(categories)}
    total_peak = max(sum(row) for row in rows)

    # (a) the construction: every byte accounted for, no allocator rounding on the CPU
    assert peaks["parameter"] == PARAMS
    assert peaks["optimizer_state"] == 2 * PARAMS + STEP_SCALARS  # exp_avg, exp_avg_sq, step
    assert peaks["gradient"] == PARAMS
    assert peaks["input"] == F32 * B * (DIN + DOUT)  # x and y
    # the hidden activation (ReLU's output, saved) and, in backward, its gradient (same shape)
    assert peaks["activation"] == 2 * F32 * B * H

    # (b) the scrape is torch's timeline of the same profile
    assert scraped["otelprof_window_memory_peak_bytes"] == {("cpu", c): float(v) for c, v in peaks.items()}
    assert scraped["otelprof_window_memory_total_peak_bytes"] == {("cpu",): float(total_peak)}
    assert scraped["otelprof_window_memory_timeline_failed_total"] == {(): 0.0}
    # an out-of-memory error from now on names what the last window's categories peaked at
    assert oom.last_categories() == ("cpu", peaks)

    # (c) one memory span per recorded step, under its train.step, in its trace
    spans = rec.spans
    memory = {_attrs(s.attributes)["otelprof.step.number"]: s for s in spans if s.name == "memory · cpu"}
    assert sorted(memory) == list(RECORDED)
    for n, span in memory.items():
        trace = ids.trace_id(f"step|{RUN}|{n}")
        (step,) = [s for s in spans if s.trace_id == trace and s.name == "train.step"]
        assert span.trace_id == trace and span.parent_span_id == step.span_id
        # the live step's interval: the step span's, narrowed by 1 us at either end
        assert 0 <= span.start_time_unix_nano - step.start_time_unix_nano <= 2000
        assert 0 <= step.end_time_unix_nano - span.end_time_unix_nano <= 2000
        attrs = _attrs(span.attributes)
        first = max(0, bisect.bisect_right(times, span.start_time_unix_nano // 1000) - 1)
        last = bisect.bisect_right(times, span.end_time_unix_nano // 1000) - 1
        inside = rows[first : last + 1]
        assert _by_category(attrs, "peak_bytes") == {c: max(r[i] for r in inside) for i, c in enumerate(categories)}
        assert attrs["otelprof.memory.total.peak_bytes"] == max(sum(r) for r in inside)
        # an event at each phase span's start and end, holding torch's row then
        phases = sorted(
            (s for s in spans if s.parent_span_id == step.span_id and "otelprof.phase.name" in _attrs(s.attributes)),
            key=lambda s: s.start_time_unix_nano,
        )
        expected = [
            (t, _attrs(p.attributes)["otelprof.phase.name"], edge)
            for p in phases
            for t, edge in ((p.start_time_unix_nano, "start"), (p.end_time_unix_nano, "end"))
        ]
        events = [(e.time_unix_nano, _attrs(e.attributes)) for e in span.events]
        assert all(e.name == conventions.MEMORY_EVENT_NAME for e in span.events)
        assert [(t, a["otelprof.phase.name"], a["otelprof.phase.boundary"]) for t, a in events] == expected
        for t, a in events:
            assert list(_by_category(a, "bytes").values()) == _row(times, rows, t)
        held = {(a["otelprof.phase.name"], a["otelprof.phase.boundary"]): _by_category(a, "bytes") for _t, a in events}
        assert [name for name, edge in held if edge == "start"] == ["forward", "backward", "optimizer"]
        for at in held.values():  # the model and its optimizer state are there throughout
            assert at["parameter"] == PARAMS and at["optimizer_state"] == 2 * PARAMS + STEP_SCALARS
        assert held[("forward", "start")]["gradient"] == 0  # zero_grad() set them to None
        assert held[("forward", "start")]["activation"] == 0
        assert held[("forward", "end")]["activation"] == F32 * B * (H + DOUT)  # ReLU's output, the model's
        assert held[("optimizer", "start")]["gradient"] == PARAMS
        for key in attrs.keys() | {k for _t, a in events for k in a}:  # registered for where they are
            assert key in conventions.BY_NAME

    if "otlp" in exporters:  # the same values over OTLP
        points: dict[tuple[str, ...], float] = {}
        for request in rec.metric_requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name in ("otelprof.window.memory.peak", "otelprof.window.memory.total.peak"):
                            assert metric.unit == "By"
                            for p in metric.gauge.data_points:
                                a = _attrs(p.attributes)
                                points[(metric.name, a["device"], a.get("category", ""))] = p.as_double
        assert points == {
            **{("otelprof.window.memory.peak", "cpu", c): float(v) for c, v in peaks.items()},
            ("otelprof.window.memory.total.peak", "cpu", ""): float(total_peak),
        }
    seconds = list(windows.conversions.memory_s)
    assert len(seconds) == 1
    print(f"memory timeline on the conversion thread: {seconds[0] * 1000:.1f} ms")


def test_a_window_without_profile_memory_has_no_memory_timeline(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp_path / "spool", **SCHEDULE)
        _train()
        windows = session.windows
        assert windows is not None
        wait_until(lambda: windows.windows_done == 1)
        scraped = _scrape(session.metrics_port)
        live_session.stop(session)
    assert any(s.name.startswith("ProfilerStep#") for s in rec.spans)  # the window was recorded
    assert not [s for s in rec.spans if s.name.startswith("memory ·")]
    assert scraped == {"otelprof_window_memory_timeline_failed_total": {(): 0.0}}
    assert not list(windows.conversions.memory_s)  # not even attempted
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _memory_steps(rec: HttpReceiver) -> set[int]:
    return {_attrs(s.attributes)["otelprof.step.number"] for s in rec.spans if s.name == "memory · cpu"}


def test_a_step_the_sampler_drops_takes_its_memory_spans_along(tmp_path: Path) -> None:
    """A ratio sampler decides by trace id; the memory spans are in their step's trace."""
    env = {
        **SCHEDULE,
        "OTELPROF_PROFILE_ACTIVE": "4",
        "OTELPROF_PROFILE_OPTIONS": "profile_memory",
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.5",
    }
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp_path / "spool", **env)
        _train(8)
        live_session.stop(session)
    kept = {_attrs(s.attributes)["otelprof.step.number"] for s in rec.spans if s.name == "train.step"}
    recorded = set(range(3, 7))
    assert recorded - kept and recorded & kept  # this run id's trace ids: some kept, some dropped
    assert _memory_steps(rec) == recorded & kept


def test_a_failing_timeline_is_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    failures: list[int] = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(timeline, "_failed_logged", False)
    try:
        for _ in range(2):  # torch's memory profiler refuses what is not a profiler result
            assert timeline.safe_window_memory(object(), (), lambda: failures.append(1)) == []
    finally:
        monkey.undo()
    assert len(failures) == 2
    assert len([r for r in caplog.records if "memory timeline failed" in r.getMessage()]) == 1


def test_boundaries_take_the_row_in_force_at_their_microsecond() -> None:
    """torch's rows are per microsecond: a boundary takes the last row at or before its
    microsecond, the first (what the window found) before it; a step's peaks start from the row
    in force when it begins."""
    times = [1000, 1000, 1005, 1010]
    rows = [[8, 0, 0, 0, 0, 0, 0, 0], [8, 0, 4, 0, 0, 0, 0, 0], [8, 0, 4, 0, 16, 0, 0, 0], [8, 0, 4, 0, 0, 2, 0, 0]]
    phases = ((b"p" * 8, 999_000, 1_004_999), (b"q" * 8, 1_005_000, 1_012_000))
    step = LiveStep(7, b"t" * 16, b"s" * 8, phases, start_ns=1_001_000, end_ns=1_009_999, phase_names=("a", "b"))
    memory = timeline.summarize(times, rows, [step], "cpu")
    assert memory.peaks == (8, 0, 4, 0, 16, 2, 0, 0) and memory.total_peak == 28 and memory.total_peak_ns == 1_005_000
    (s,) = memory.steps
    assert s.peaks == (8, 0, 4, 0, 16, 0, 0, 0) and s.total_peak == 28
    assert [(b.time_ns, b.phase, b.edge, b.sizes[4] + b.sizes[5]) for b in s.boundaries] == [
        (999_000, "a", "start", 0),
        (1_004_999, "a", "end", 0),
        (1_005_000, "b", "start", 16),
        (1_012_000, "b", "end", 2),
    ]
    assert s.boundaries[0].sizes == (8, 0, 0, 0, 0, 0, 0, 0)  # before the rows: what the window found
