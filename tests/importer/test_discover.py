"""Folders as training tools leave them (TensorBoard log dirs, Composer's torch_traces) and how
their files become runs: ranks of one run share step traces, nothing collides."""

from __future__ import annotations

import gzip
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from export.receivers import http_receiver

from otelprof.importer import find_sources
from otelprof.importer.discover import KINETO, NSYS

from .helpers import SHARED, Got, ids, import_env, received, run_import, shared

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")


def _renumbered(src: Path, dst: Path, shift: int) -> None:
    """A real trace (steps 551, 552) with its steps renumbered: a later window of the same run."""
    data = gzip.decompress(src.read_bytes())
    for step in (552, 551):
        data = data.replace(f"ProfilerStep#{step}".encode(), f"ProfilerStep#{step + shift}".encode())
    dst.write_bytes(gzip.compress(data))


def _import(tmp_path: Path, *paths: Path) -> list[Got]:
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        assert run_import(*paths, "-q") == 0
    return received(rec.requests)


def _steps(spans: list[Got]) -> dict[tuple[str, bytes], set[object]]:
    out: dict[tuple[str, bytes], set[object]] = defaultdict(set)
    for g in spans:
        if g.span.name.startswith("ProfilerStep#") and not g.span.parent_span_id and not g.attr("otelprof.synthetic"):
            out[(g.span.name, g.span.trace_id)].add(g.resource.get("otelprof.distributed.rank"))
    return out


def test_composer_folder_two_windows_two_ranks(tmp_path: Path) -> None:
    folder = tmp_path / "bert-run-7" / "torch_traces"
    folder.mkdir(parents=True)
    for rank in (0, 1):
        src = shared(f"sampled_rank-{rank}")
        shutil.copy(src, folder / f"rank{rank}.551.pt.trace.json.gz")
        _renumbered(src, folder / f"rank{rank}.651.pt.trace.json.gz", 100)
        _renumbered(src, folder / f"rank{rank}.751.pt.trace.json.gz", 200)
    sources = find_sources([tmp_path / "bert-run-7"])
    run_ids = {s.run_id for s in sources}
    assert len(run_ids) == 3
    assert {run_id.split("#")[0] for run_id in run_ids} == {f"bert-run-7@{step}" for step in (551, 651, 751)}
    spans = _import(tmp_path, tmp_path / "bert-run-7")
    assert max(Counter(ids(spans)).values()) == 1, "span ids collide across windows"
    steps = _steps(spans)
    assert {name for name, _ in steps} >= {"ProfilerStep#551", "ProfilerStep#651", "ProfilerStep#751"}
    for (name, _trace), ranks in steps.items():
        assert ranks == {0, 1}, name  # one trace per step, holding both ranks


def test_tensorboard_log_dir_with_ranks_in_file_names(tmp_path: Path) -> None:
    """torch's tensorboard_trace_handler folder; the trace has no distributedInfo, so the rank
    comes from the worker name; a non-trace JSON beside it is skipped."""
    logdir = tmp_path / "tb" / "resnet"
    logdir.mkdir(parents=True)
    src = shared("amd_trace")  # steps 1 and 2, no distributedInfo
    shutil.copy(src, logdir / "node1_rank-2.1700000000001.pt.trace.json.gz")
    shutil.copy(src, logdir / "node1_rank-3.1700000000002.pt.trace.json.gz")
    (logdir / "hparams.json").write_text('{"lr": 0.1}')
    (logdir / "events.out.tfevents.1700000000.node1").write_bytes(b"\x00" * 16)
    sources = find_sources([tmp_path / "tb"])
    assert [(s.path.name, s.kind, s.rank) for s in sources] == [
        ("node1_rank-2.1700000000001.pt.trace.json.gz", KINETO, 2),
        ("node1_rank-3.1700000000002.pt.trace.json.gz", KINETO, 3),
    ]
    assert len({s.run_id for s in sources}) == 1 and sources[0].run_id.startswith("resnet/node1#")
    spans = _import(tmp_path, tmp_path / "tb")
    assert {g.resource["otelprof.distributed.rank"] for g in spans} == {2, 3}
    steps = _steps(spans)
    assert sorted(name for name, _ in steps) == ["ProfilerStep#1", "ProfilerStep#2"]
    assert all(ranks == {2, 3} for ranks in steps.values())


def test_same_rank_twice_without_steps_become_separate_runs(tmp_path: Path) -> None:
    src = shared("critical_path")  # rank 0, no ProfilerStep
    for i in (1, 2):
        shutil.copy(src, tmp_path / f"bench_{i}.json.gz")
    sources = find_sources([tmp_path])
    first, second = (s.run_id for s in sources)
    assert (
        first != second and first.startswith(f"{tmp_path.name}/bench#") and second.startswith(f"{tmp_path.name}/bench#")
    )
    assert [s.run_id for s in find_sources([tmp_path])] == [first, second]  # stable
    spans = _import(tmp_path, tmp_path)
    assert max(Counter(ids(spans)).values()) == 1


def test_run_id_flag_puts_every_file_in_one_run(tmp_path: Path) -> None:
    files = [shared("sampled_rank-0"), shared("cpu_only")]
    assert {s.run_id for s in find_sources(files, run_id="job-42")} == {"job-42"}
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        assert run_import(*files, "--run-id", "job-42", "-q") == 0
    spans = received(rec.requests)
    assert {g.resource["otelprof.run.id"] for g in spans} == {"job-42"}
    assert [ranks for (name, _), ranks in _steps(spans).items() if name == "ProfilerStep#551"] == [{0, 34}]


def test_folders_mix_kineto_and_nsys_in_a_stable_order(tmp_path: Path) -> None:
    sources = find_sources([SHARED])
    assert [s.path for s in sources] == sorted(s.path for s in sources)
    assert Counter(s.kind for s in sources) == {KINETO: 15, NSYS: 2}
    assert find_sources([SHARED]) == sources
