"""A live window's raw Kineto trace kept beside its spans: a real torch CPU training loop under the
instrumentor, its windows kept gzip-compressed in a private folder (bounded, oldest first), named
on the window's spans, and never in the way: a folder that cannot take them is logged once and
counted while the spans still arrive."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import shared_trace
from export.receivers import HttpReceiver, http_receiver
from prometheus_client import CollectorRegistry

import otelprof
from capture import live_session
from otelprof.capture.windows import keep

torch = pytest.importorskip("torch")

QUIET = {"OTELPROF_TRIGGER_SIGNAL": "none", "OTELPROF_ANOMALY_FACTOR": "0", "OTELPROF_PROFILE_EARLY": "0"}
#: one window: step 2 warms up, 3 and 4 are recorded
ONE_WINDOW = {
    "OTELPROF_PROFILE_SKIP_FIRST": "2",
    "OTELPROF_PROFILE_WAIT": "0",
    "OTELPROF_PROFILE_WARMUP": "1",
    "OTELPROF_PROFILE_ACTIVE": "2",
    "OTELPROF_PROFILE_REPEAT": "1",
}
#: a window every 3 steps: wait, warm up, record one (steps 2, 5, 8 of 11)
EVERY_THIRD = {
    "OTELPROF_PROFILE_SKIP_FIRST": "0",
    "OTELPROF_PROFILE_WAIT": "1",
    "OTELPROF_PROFILE_WARMUP": "1",
    "OTELPROF_PROFILE_ACTIVE": "1",
    "OTELPROF_PROFILE_REPEAT": "0",
}
KEPT = re.compile(r"^keep_rank0_step(\d+)_\d{8}T\d{6}\.\d{3}Z\.pt\.trace\.json\.gz$")


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


def _run(rec: HttpReceiver, tmp_path: Path, env: dict[str, str], steps: int = 8) -> otelprof.instrumentation.Session:
    session = live_session.start(rec.port, tmp_path / "spool", **{"OTELPROF_RUN_ID": "keep", **QUIET, **env})
    live_session.train(steps)
    live_session.stop(session)
    return session


def _attrs(span: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value") or "string_value") for kv in span.attributes}


def _markers(rec: HttpReceiver) -> list[int]:
    return sorted(int(s.name.split("#")[1]) for s in rec.spans if s.name.startswith("ProfilerStep#"))


def _kineto_steps(path: Path) -> list[int]:
    """The ``ProfilerStep#N`` numbers of a kept file, read as Perfetto or TensorBoard would."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#"))


def _not_kept_metric(session: otelprof.instrumentation.Session) -> float:
    assert session.windows is not None and session.windows.metrics is not None
    registry = CollectorRegistry()
    registry.register(session.windows.metrics)
    value = registry.get_sample_value(
        "otelprof_window_traces_not_kept_total", {"run": "keep", "rank": "0", "local_rank": "0"}
    )
    assert value is not None
    return value


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_window_is_kept_gzipped_private_and_whole(
    receiver: HttpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default, in ~/.cache/otelprof/traces: the folders otelprof makes 0700, the file 0600,
    named by run, rank, first step and time, and holding the window's steps."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    session = _run(receiver, tmp_path, {**ONE_WINDOW, "OTELPROF_TRACE_DIR": ""})  # empty: the default
    folder = tmp_path / "home" / ".cache" / "otelprof" / "traces"
    [kept] = folder.iterdir()
    match = KEPT.match(kept.name)
    assert match is not None and int(match.group(1)) == 3
    assert _markers(receiver) == [3, 4]
    assert _kineto_steps(kept) == [3, 4]  # the very window the spans were made of
    assert (_mode(folder.parent), _mode(folder), _mode(kept)) == (0o700, 0o700, 0o600)
    assert not stat.S_ISLNK(kept.lstat().st_mode)
    assert _not_kept_metric(session) == 0
    # what otelprof convert makes of the kept file: the same ProfilerStep spans as were sent
    converted = otelprof.convert(kept, options=otelprof.ConvertOptions(run_id="keep"))
    assert converted.stats["steps"] == 2


def test_the_kept_file_is_named_on_the_windows_spans(receiver: HttpReceiver, tmp_path: Path) -> None:
    _run(receiver, tmp_path, {**ONE_WINDOW, "OTELPROF_TRACE_DIR": str(tmp_path / "traces")})
    [kept] = (tmp_path / "traces").iterdir()
    named = [s for s in receiver.spans if "otelprof.source.file" in _attrs(s)]
    assert {_attrs(s)["otelprof.source.file"] for s in named} == {str(kept)}
    markers = {s.trace_id for s in receiver.spans if s.name.startswith("ProfilerStep#")}
    assert markers and markers <= {s.trace_id for s in named}  # every profiled step's trace names it
    assert not [s for s in named if s.name == "train.step"]  # the live spans are not the file's


def test_the_newest_windows_of_a_rank_are_kept_and_nothing_else_is_touched(
    receiver: HttpReceiver, tmp_path: Path
) -> None:
    folder = tmp_path / "traces"
    folder.mkdir(mode=0o755)  # a folder of the user's, readable by others: made private
    older = folder / "old-run_rank0_step7_20200101T000000.000Z.pt.trace.json.gz"  # an earlier run's
    other_rank = folder / "keep_rank1_step2_20200101T000000.000Z.pt.trace.json.gz"
    notes = folder / "notes.txt"
    outside = tmp_path / "outside.pt.trace.json.gz"
    for path in (older, other_rank, notes, outside):
        path.write_bytes(b"x")
    link = folder / "keep_rank0_step1_20000101T000000.000Z.pt.trace.json.gz"
    link.symlink_to(outside)  # named like a kept trace: never followed, never removed
    env = {**EVERY_THIRD, "OTELPROF_TRACE_DIR": str(folder), "OTELPROF_KEEP_TRACES": "2"}
    session = _run(receiver, tmp_path, env, steps=11)
    assert _markers(receiver) == [2, 5, 8]  # three windows sent
    kept = sorted(p for p in folder.iterdir() if KEPT.match(p.name) and not p.is_symlink())
    assert [_kineto_steps(p) for p in kept] == [[5], [8]]  # the two newest, each its own window
    assert not older.exists()  # rank 0's oldest went first, whatever its run
    assert other_rank.exists() and notes.exists() and link.is_symlink() and outside.read_bytes() == b"x"
    assert _mode(folder) == 0o700
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []
    assert session.windows is not None and session.windows.conversions.keeper is not None
    assert session.windows.conversions.keeper.kept == 3


def test_zero_keeps_nothing(receiver: HttpReceiver, tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    _run(receiver, tmp_path, {**ONE_WINDOW, "OTELPROF_TRACE_DIR": str(folder), "OTELPROF_KEEP_TRACES": "0"})
    assert _markers(receiver) == [3, 4]
    assert not folder.exists()
    assert not [s for s in receiver.spans if "otelprof.source.file" in _attrs(s)]


def test_an_unwritable_folder_is_logged_once_counted_and_the_windows_still_sent(
    receiver: HttpReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # the folder would be under a file: no one, root included, can make it
    two_windows = {**ONE_WINDOW, "OTELPROF_PROFILE_ACTIVE": "1", "OTELPROF_PROFILE_REPEAT": "2"}
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        session = _run(receiver, tmp_path, {**two_windows, "OTELPROF_TRACE_DIR": str(blocker / "traces")})
    assert _markers(receiver) == [3, 5]  # both windows converted and sent
    warnings = [r for r in caplog.records if "trace was not kept" in r.getMessage()]
    assert len(warnings) == 1 and "a-file" in warnings[0].getMessage()
    assert _not_kept_metric(session) == 2
    assert session.windows is not None and session.windows.windows_failed == 0
    assert not [s for s in receiver.spans if "otelprof.source.file" in _attrs(s)]


def test_the_users_own_windows_are_not_copied(receiver: HttpReceiver, tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    env = {**QUIET, "OTELPROF_PROFILE_SKIP_FIRST": "999", "OTELPROF_RUN_ID": "keep", "OTELPROF_TRACE_DIR": str(folder)}
    session = live_session.start(receiver.port, tmp_path / "spool", **env)
    logdir = tmp_path / "tb"
    handler = otelprof.trace_handler(then=torch.profiler.tensorboard_trace_handler(str(logdir)))
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(schedule=schedule, on_trace_ready=handler) as prof:
        live_session.train(6, prof.step)
    live_session.stop(session)
    assert [s for s in receiver.spans if s.name.startswith("ProfilerStep#")]  # the user's window was sent
    assert len(list(logdir.iterdir())) == 1  # the user's file, and only it
    assert not folder.exists()


# --- the keeper on real Kineto traces, its bounds and refusals ------------------------------


@pytest.fixture
def trace_json(tmp_path: Path) -> Path:
    """A real Kineto trace, as the conversion thread has it: plain JSON."""
    path = tmp_path / "window.json"
    path.write_bytes(gzip.decompress(shared_trace("alexnet").read_bytes()))
    return path


def _keep(keeper: keep.TraceKeeper, source: Path, second: int, rank: int = 0) -> Path | None:
    return keeper.keep(source, keep.trace_name("run", rank, 10 + second, (1_700_000_000 + second) * 10**9))


def test_the_byte_bound_evicts_the_oldest_of_every_rank(trace_json: Path, tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    probe = keep.TraceKeeper(keep.KeepSettings(directory=folder / "probe"))
    first = _keep(probe, trace_json, 0)
    assert first is not None
    size = first.stat().st_size
    assert gzip.decompress(first.read_bytes()) == trace_json.read_bytes()
    keeper = keep.TraceKeeper(keep.KeepSettings(count=100, max_bytes=2 * size, directory=folder))
    paths = [_keep(keeper, trace_json, 1, rank=1), _keep(keeper, trace_json, 2), _keep(keeper, trace_json, 3)]
    assert all(p is not None for p in paths)
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == sorted(p.name for p in paths[1:] if p)
    assert keeper.not_kept == {}


def test_a_trace_over_the_byte_bound_is_not_kept_and_counted(trace_json: Path, tmp_path: Path) -> None:
    counted: list[None] = []
    keeper = keep.TraceKeeper(keep.KeepSettings(max_bytes=1000, directory=tmp_path / "t"), lambda: counted.append(None))
    assert _keep(keeper, trace_json, 0) is None and _keep(keeper, trace_json, 1) is None
    assert keeper.not_kept == {keep.TOO_LARGE: 2} and len(counted) == 2
    assert list((tmp_path / "t").iterdir()) == []  # no file, no temp file


def test_folders_that_are_not_private_are_refused(
    trace_json: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    cases = [link, shared]
    if os.geteuid() == 0:  # only root can give a folder to another user
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 4242, 4242)
        cases.append(foreign)
    for folder in cases:
        caplog.clear()
        keeper = keep.TraceKeeper(keep.KeepSettings(directory=folder))
        with caplog.at_level(logging.WARNING, logger="otelprof"):
            assert _keep(keeper, trace_json, 0) is None and _keep(keeper, trace_json, 1) is None
        assert keeper.not_kept == {keep.UNSAFE: 2}, folder
        assert len([r for r in caplog.records if "OTELPROF_TRACE_DIR" in r.getMessage()]) == 1
    assert list(real.iterdir()) == [] and list(shared.iterdir()) == []
