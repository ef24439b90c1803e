"""Two real gloo ranks under the instrumentor, exporting to a real OTLP receiver: step N of both
ranks shares one trace (run id from the environment, or agreed through torch.distributed),
resources carry rank and world size, each rank's /metrics has the straggler ratio, and a
profiled step's operators land in per-rank detail traces linked to the step trace."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from export.receivers import HttpReceiver, free_port, http_receiver
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from otelprof.otlp import ids

pytest.importorskip("torch.distributed")
pytestmark = [pytest.mark.torch, pytest.mark.slow]  # real training processes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STEPS = 12
PROFILED = (3, 4)  # skip 0-1, warm up 2, record 3-4
# variables of the outer environment that would decide identity for the ranks
_LAUNCHER_VARS = ("OTELPROF_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def _run(command: list[str], rec: HttpReceiver, tmp_path: Path, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
            "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
            "OTELPROF_STRAGGLER_STEPS": "4",
            "OTELPROF_SPLIT_WORLD_SIZE": "2",  # two ranks are "many": operators go to detail traces
            "OTELPROF_PROFILE_SKIP_FIRST": "2",
            "OTELPROF_PROFILE_WAIT": "0",
            "OTELPROF_PROFILE_WARMUP": "1",
            "OTELPROF_PROFILE_ACTIVE": "2",
            "OTELPROF_PROFILE_REPEAT": "1",
            "OTELPROF_TRIGGER_SIGNAL": "none",
            "OTELPROF_ANOMALY_FACTOR": "0",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **extra,
        }
    )
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "rank 0 trained" in out.stdout and "rank 1 trained" in out.stdout
    return out.stderr


def _by_rank(rec: HttpReceiver) -> dict[int, list[tuple[dict[str, Any], Any]]]:
    """Each rank's spans with their resource attributes."""
    out: dict[int, list[tuple[dict[str, Any], Any]]] = defaultdict(list)
    for request in rec.requests:
        for rs in request.resource_spans:
            resource = {kv.key: kv.value for kv in rs.resource.attributes}
            rank = resource["otelprof.distributed.rank"].int_value
            out[rank].extend((resource, s) for ss in rs.scope_spans for s in ss.spans)
    return out


def _ratios(tmp_path: Path, run_id: str) -> dict[int, float]:
    ratios = {}
    for rank in (0, 1):
        text = (tmp_path / f"metrics-{rank}.txt").read_text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        [sample] = families["otelprof_straggler_ratio"].samples
        assert sample.labels == {"run": run_id, "rank": str(rank), "local_rank": sample.labels["local_rank"]}
        assert math.isfinite(sample.value) and sample.value > 0
        steps = families["otelprof_steps"].samples
        assert [s.value for s in steps if s.name == "otelprof_steps_total"] == [STEPS]
        ratios[rank] = sample.value
    # both read the same (last) exchange: with two ranks the median is their mean
    assert ratios[0] + ratios[1] == pytest.approx(2.0)
    return ratios


def _check_traces(rec: HttpReceiver, run_id: str) -> None:
    spans = _by_rank(rec)
    assert sorted(spans) == [0, 1]
    for rank, pairs in spans.items():
        for resource, _span in pairs:
            assert resource["otelprof.distributed.world_size"].int_value == 2
            assert resource["otelprof.run.id"].string_value == run_id
        steps = {
            next(kv.value.int_value for kv in s.attributes if kv.key == "otelprof.step.number"): s
            for _r, s in pairs
            if s.name == "train.step"
        }
        assert sorted(steps) == list(range(STEPS)), f"rank {rank}"
        for n, step in steps.items():  # both ranks' step n: one trace, the converter's id
            assert step.trace_id == ids.trace_id(f"step|{run_id}|{n}")

    for n in PROFILED:
        step_trace = ids.trace_id(f"step|{run_id}|{n}")
        for rank, pairs in spans.items():
            detail_trace = ids.trace_id(f"detail|{run_id}|{rank}|{n}")
            in_step = [s for _r, s in pairs if s.trace_id == step_trace]
            detail = [s for _r, s in pairs if s.trace_id == detail_trace]
            # the step trace holds this rank's step spans only; its operators are in its detail trace
            assert {s.name.split(" ")[0] for s in in_step} == {  # "forward Model": the phase, its module
                "train.step",
                "data",
                "forward",
                "backward",
                "optimizer",
                f"ProfilerStep#{n}",
            }
            assert {"aten::linear", "aten::addmm", "Optimizer.step#SGD.step"} <= {s.name for s in detail}
            [marker] = [s for s in in_step if s.name == f"ProfilerStep#{n}"]
            [root] = [s for s in detail if s.name == f"ProfilerStep#{n}"]
            assert root.parent_span_id == b""
            # linked both ways (the marker also carries fwdbwd links of short ops folded into it)
            assert _links(marker, "rank_detail") == [(detail_trace, root.span_id)]
            assert _links(root, "step") == [(step_trace, marker.span_id)]
            by_id = {s.span_id: s for s in detail}
            linear = next(s for s in detail if s.name == "aten::linear")
            assert _root_of(linear, by_id) is root  # operators hang under the detail root


def _links(span: Any, kind: str) -> list[tuple[bytes, bytes]]:
    return [
        (lk.trace_id, lk.span_id)
        for lk in span.links
        if any(kv.key == "otelprof.link.kind" and kv.value.string_value == kind for kv in lk.attributes)
    ]


def _root_of(span: Any, by_id: dict[bytes, Any]) -> Any:
    while span.parent_span_id:
        span = by_id[span.parent_span_id]
    return span


def test_torchrun_ddp_with_run_id(tmp_path: Path) -> None:
    """``otelprof run -- torchrun``: OTELPROF_RUN_ID names the run; a DDP model keeps the ranks
    in lockstep."""
    script = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    script += [str(HERE / "dist_train.py"), str(tmp_path), str(STEPS), "torchrun"]
    with http_receiver() as rec:
        _run([sys.executable, "-m", "otelprof", "run", "--", *script], rec, tmp_path, OTELPROF_RUN_ID="ddp-run")
    _check_traces(rec, "ddp-run")
    local_ranks = {
        r: {res["otelprof.distributed.local_rank"].int_value for res, s in pairs if s.name == "train.step"}
        for r, pairs in _by_rank(rec).items()
    }
    assert local_ranks == {0: {0}, 1: {1}}  # torchrun's LOCAL_RANK
    _ratios(tmp_path, "ddp-run")


def test_spawned_ranks_agree_on_the_run_id(tmp_path: Path) -> None:
    """No launcher and no OTELPROF_RUN_ID: ranks and world size come from torch.distributed,
    and rank 0's run id is shared with rank 1. Rank 1 sleeps every step: it is the straggler."""
    command = [sys.executable, str(HERE / "dist_train.py"), str(tmp_path), str(STEPS), "spawn", str(free_port())]
    with http_receiver() as rec:
        _run(command, rec, tmp_path)
    spans = _by_rank(rec)
    run_ids = {r: pairs[0][0]["otelprof.run.id"].string_value for r, pairs in spans.items()}
    assert len(set(run_ids.values())) == 1 and len(run_ids[0]) == 32  # rank 0's random id, on both
    _check_traces(rec, run_ids[0])
    ratios = _ratios(tmp_path, run_ids[0])
    assert ratios[1] > 1 > ratios[0]


def _malloc_debug() -> dict[str, str]:
    """glibc's malloc checking (glibc >= 2.34: a preloaded library): heap corruption aborts."""
    import glob

    dirs = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/lib/*-linux-gnu", "/usr/lib/*-linux-gnu")
    if not any(glob.glob(f"{d}/libc_malloc_debug.so.0") for d in dirs):
        pytest.skip("glibc's libc_malloc_debug.so.0 is not installed")
    return {"LD_PRELOAD": "libc_malloc_debug.so.0", "MALLOC_CHECK_": "3", "MALLOC_PERTURB_": "165"}


MALLOC_RUNS = 3  # before the fix, 3 of 3 runs aborted here with free(): invalid pointer


def test_spawned_ranks_exit_cleanly_under_malloc_checking(tmp_path: Path) -> None:
    """The spawned two-rank job with a profiling window, under glibc's malloc checking: no run
    aborts at exit. (The straggler exchange issued inside the window completed on a gloo thread
    after the window stopped, and torch wrote its end into the freed profiler's events.)"""
    checking = _malloc_debug()
    for run in range(MALLOC_RUNS):
        out = tmp_path / str(run)
        out.mkdir()
        command = [sys.executable, str(HERE / "dist_train.py"), str(out), str(STEPS), "spawn", str(free_port())]
        with http_receiver() as rec:
            stderr = _run(command, rec, out, **checking)  # asserts exit status 0 and both ranks done
        assert "free()" not in stderr and "malloc" not in stderr, stderr[-2000:]
        _check_traces(rec, _by_rank(rec)[0][0][0]["otelprof.run.id"].string_value)


def test_a_process_with_a_window_exits_cleanly_under_malloc_checking(tmp_path: Path) -> None:
    """One process, one profiling window, malloc checking on: trains, exports, exits 0."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    with http_receiver() as rec:
        env.update(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}",
                "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
                "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
                "OTELPROF_RUN_ID": "one",
                "OTELPROF_PROFILE_SKIP_FIRST": "2",
                "OTELPROF_PROFILE_WAIT": "0",
                "OTELPROF_PROFILE_ACTIVE": "2",
                "OTELPROF_PROFILE_REPEAT": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                **_malloc_debug(),
            }
        )
        command = [sys.executable, str(HERE / "train_loop.py"), str(STEPS), "0", "--auto"]
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0 and f"trained {STEPS}" in out.stdout, out.stderr[-4000:]
    names = {s.name for s in rec.spans}
    assert {"train.step", "aten::linear", "ProfilerStep#3", "ProfilerStep#4"} <= names


def test_a_rank_without_otelprof_never_blocks_training(tmp_path: Path) -> None:
    """otelprof disabled on rank 1 (a misconfiguration): rank 0 waits for it at the first step
    for the group timeout (3 s here), logs once, and trains on with its own run id."""
    command = [sys.executable, str(HERE / "dist_train.py"), str(tmp_path), str(STEPS), "mismatch", str(free_port())]
    with http_receiver() as rec:
        stderr = _run(command, rec, tmp_path)
    assert stderr.count("otelprof could not join the torch.distributed job") == 1
    assert "this rank's steps get their own traces" in stderr
    spans = _by_rank(rec)
    assert sorted(spans) == [0]  # rank 1 sends nothing
    steps = sorted(
        next(kv.value.int_value for kv in s.attributes if kv.key == "otelprof.step.number")
        for _r, s in spans[0]
        if s.name == "train.step"
    )
    assert steps == list(range(STEPS))
    assert {r["otelprof.distributed.world_size"].int_value for r, _s in spans[0]} == {2}
