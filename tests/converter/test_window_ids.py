"""Ids when several windows or files of one rank share a run id (``import --run-id``, or a live
run's successive profiling windows): no two spans share a (trace id, span id), the same file
always gives the same ids, and step N still lands in the trace every rank and the live step
span use (``step|run|N``)."""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import (
    KINETO_TRACES,
    SLOW_REFERENCE,
    all_spans_pb,
    is_big,
    load_raw,
    micros_to_ns,
    read_json_bytes,
    shared_trace,
    trace_id_for,
)

from otelprof.converter import ConvertResult, convert
from otelprof.otlp import ids

STEP = re.compile(r"ProfilerStep#([0-9]+)\Z")


def _traces(engine: str) -> list[Path]:
    """Every shared trace for the native engine; the ones the slow reference converts quickly."""
    if not KINETO_TRACES:
        pytest.skip("no shared Kineto traces")
    return [p for p in KINETO_TRACES if engine == "native" or not is_big(p)]


def _owners(results: dict[str, ConvertResult]) -> dict[tuple[bytes, bytes], set[tuple[str, str, int]]]:
    owners: dict[tuple[bytes, bytes], set[tuple[str, str, int]]] = defaultdict(set)
    for name, result in results.items():
        for s in all_spans_pb(result.requests):
            owners[(s.trace_id, s.span_id)].add((name, s.name, s.start_time_unix_nano))
    return owners


def _assert_step_traces(results: dict[str, ConvertResult], run_id: str) -> int:
    """Every ProfilerStep#N root is in the trace of ``step|run|N`` (the live step span's)."""
    roots = 0
    for result in results.values():
        for s in all_spans_pb(result.requests):
            synthetic = any(kv.key == "otelprof.synthetic" for kv in s.attributes)  # a detail trace's root
            if (m := STEP.match(s.name)) and not s.parent_span_id and not synthetic:
                assert s.trace_id == ids.trace_id(f"step|{run_id}|{m.group(1)}"), s.name
                roots += 1
    return roots


@SLOW_REFERENCE
def test_unrelated_files_with_one_run_id_and_rank_never_share_ids(engine: str) -> None:
    """What ``import --run-id ref`` of a folder of unrelated rank-0 traces does."""
    results = {trace_id_for(p): convert(p, engine=engine, run_id="ref", rank=0) for p in _traces(engine)}
    owners = _owners(results)
    shared = {k: v for k, v in owners.items() if len(v) > 1}
    assert not shared, f"{len(shared)} ids shared by different spans, e.g. {next(iter(shared.values()))}"
    assert len({r.window_id for r in results.values()}) == len(results)
    assert _assert_step_traces(results, "ref") >= len(results) - 2  # two shared traces have no steps


def test_the_same_trace_gives_the_same_ids(engine: str) -> None:
    path = shared_trace("trace_filter__sampled_rank-0")
    first = convert(path, engine=engine, run_id="ref", rank=0)
    again = convert(path, engine=engine, run_id="ref", rank=0)
    plain = convert(read_json_bytes(path), engine=engine, run_id="ref", rank=0)
    regzipped = convert(gzip.compress(read_json_bytes(path), 1), engine=engine, run_id="ref", rank=0)
    assert first.requests == again.requests == plain.requests == regzipped.requests
    assert first.window_id == plain.window_id and re.fullmatch("[0-9a-f]{16}", first.window_id)


def test_the_window_id_is_the_content_of_the_window(engine: str) -> None:
    """The window id follows its definition (reference/ids.py), computed here from the raw
    JSON; the span ids follow from it and the event ordinals."""
    path = shared_trace("amd_trace__mi250")
    result = convert(path, engine=engine, detail="full", run_id="ref", rank=0)
    raw = load_raw(path)
    base = raw.base_ns
    bounds = [
        (base + micros_to_ns(e["ts"]), base + micros_to_ns(e["ts"]) + micros_to_ns(e.get("dur", 0)))
        for _, e in raw.complete()
    ]
    assert result.window_id == ids.window_id(bounds, len(raw.events))
    span_base = ids.span_base("ref", "0", result.window_id)
    got = {s.span_id for s in all_spans_pb(result.requests)}
    assert {ids.span_id(span_base, ordinal) for ordinal, _ in raw.complete()} <= got


def _two_windows(tmp_path: Path) -> list[Path]:
    """Two profiling windows of one process (torch's schedule with repeat=2), as a live run
    makes them: steps 2-3 and 6-7."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    paths: list[Path] = []

    def ready(prof: Any) -> None:
        paths.append(tmp_path / f"window{len(paths)}.json")
        prof.export_chrome_trace(str(paths[-1]))

    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(8):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            prof.step()
    assert len(paths) == 2
    return paths


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_two_live_windows_of_one_rank(engine: str, tmp_path: Path) -> None:
    """Both windows' operators join the live step traces, and their window traces and span
    ids stay apart (the "PyTorch Profiler (0)" roots had one id before). At full detail: at
    default detail a window root alone in its trace is not sent (checked below)."""
    windows = _two_windows(tmp_path)
    results = {p.name: convert(p, engine=engine, run_id="live-run", rank=3, detail="full") for p in windows}
    owners = _owners(results)
    assert all(len(v) == 1 for v in owners.values())
    assert _assert_step_traces(results, "live-run") == 4
    window_roots = [
        (s.trace_id, s.span_id)
        for r in results.values()
        for s in all_spans_pb(r.requests)
        if s.name.startswith("PyTorch Profiler") and not s.parent_span_id
    ]
    assert len(window_roots) == 2 and window_roots[0][0] != window_roots[1][0]
    for p in windows:  # default detail: the lone window roots are not sent, and counted
        result = convert(p, engine=engine, run_id="live-run", rank=3)
        names = {s.name for s in all_spans_pb(result.requests)}
        assert not any(name.startswith("PyTorch Profiler") for name in names)
        assert result.stats["dropped_window_roots"] == 1
