"""``otelprof import`` of every shared trace (Kineto and Nsight Systems) into a real OTLP/HTTP
receiver: every span arrives exactly once, kernels sit under their launches, the ranks of a
multi-rank set share step traces, and a second import gives the same ids."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from export.receivers import http_receiver

from otelprof.importer import convert_source, find_sources
from otelprof.resource import options_from_env

from .helpers import KINETO, NSYS, SHARED, Got, decode, ids, import_env, received, run_import, shared

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")

LAUNCHED = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "cuda_sync"}
RUNTIME = {"cuda_runtime", "Runtime", "cuda_driver"}


@dataclasses.dataclass
class Imported:
    code: int
    spans: list[Got]
    err: str


def _import(tmp_path: Path, *args: str | Path) -> Imported:
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        code = run_import(*args, "--ledger", tmp_path / "ledger.json", "-q")
    return Imported(code, received(rec.requests), "")


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> Imported:
    """Both shared folders, at default detail, in one import."""
    return _import(tmp_path_factory.mktemp("all"), KINETO, NSYS)


@pytest.fixture(scope="module")
def expected() -> list[Got]:
    """What the converter makes of each file with the run ids and ranks discovery assigns."""
    spans: list[Got] = []
    for source in find_sources([KINETO, NSYS]):
        options = dataclasses.replace(options_from_env({}), run_id=source.run_id, rank=source.rank)
        spans.extend(decode(convert_source(source, options).requests))
    return spans


@pytest.mark.slow  # converts and ships every shared trace, 640k events
def test_every_span_of_every_shared_trace_arrives_once(everything: Imported, expected: list[Got]) -> None:
    assert everything.code == 0
    got = ids(everything.spans)
    assert len(got) == len(set(got)), "a span arrived twice"
    assert Counter(got) == Counter(ids(expected))
    by_category = Counter(g.category for g in everything.spans)
    assert by_category == Counter(g.category for g in expected)
    # every shared file contributed: one resource per run id, rank and (nsys) process
    run_ids = {g.resource["otelprof.run.id"] for g in everything.spans}
    assert len(run_ids) == len(list(KINETO.glob("*"))) + len(list(NSYS.glob("*"))) - 2  # two pairs share one


@pytest.mark.slow
def test_kernels_hang_under_a_cpu_span_and_the_launch_when_it_is_kept(everything: Imported) -> None:
    by_id = {(g.span.trace_id, g.span.span_id): g for g in everything.spans}
    launched = [g for g in everything.spans if g.category in LAUNCHED]
    assert len(launched) > 10_000
    runtime_by_corr: dict[tuple[bytes, object, object], Got] = {}
    for g in everything.spans:
        if g.category in RUNTIME and g.attr("otelprof.gpu.correlation_id") is not None:
            runtime_by_corr[(g.span.trace_id, g.resource.get("process.pid"), g.attr("otelprof.gpu.correlation_id"))] = g
    under_launch = 0
    for g in launched:
        parent = by_id[(g.span.trace_id, g.span.parent_span_id)]
        assert parent.category not in LAUNCHED
        launch = runtime_by_corr.get(
            (g.span.trace_id, g.resource.get("process.pid"), g.attr("otelprof.gpu.correlation_id"))
        )
        if launch is not None and launch.span.span_id == g.span.parent_span_id:
            under_launch += 1
    # at default detail, launches shorter than 10 us give their kernels to the op that made them
    assert under_launch > 1000


def _raw_events(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict)]


@pytest.mark.parametrize("fragment", ["alexnet", "amd_trace", "bert-small", "dlrm_kineto__worker0"])
def test_full_detail_matches_the_raw_trace(fragment: str, tmp_path: Path) -> None:
    """Independent oracle: the trace's own complete events, category by category, and each
    kernel's parent is the runtime event with its correlation id."""
    path = shared(fragment)
    got = _import(tmp_path, path, "--detail", "full")
    assert got.code == 0
    raw = [e for e in _raw_events(path) if e.get("ph") == "X"]
    spans = [g for g in got.spans if g.category != "otelprof"]
    assert Counter(g.category for g in spans) == Counter(e.get("cat") for e in raw)
    launches = {
        (e["pid"], e["args"]["correlation"]): e["name"]
        for e in raw
        if e.get("cat") in RUNTIME and isinstance(e.get("args", {}).get("correlation"), int)
    }
    by_id = {g.span.span_id: g for g in spans}
    checked = 0
    for e in raw:
        if e.get("cat") not in LAUNCHED:
            continue
        corr = e.get("args", {}).get("correlation")
        name = next((n for (pid, c), n in launches.items() if c == corr), None)
        if name is None:
            continue
        kernel = next(
            g
            for g in spans
            if (g.attr("otelprof.gpu.kernel_name") or g.span.name) == e["name"]
            and g.attr("otelprof.gpu.correlation_id") == corr
        )
        parent = by_id[kernel.span.parent_span_id]
        assert parent.category in RUNTIME and parent.span.name == name
        assert parent.attr("otelprof.gpu.correlation_id") == corr
        checked += 1
    assert checked > 0 or fragment == "amd_trace"


def _step_traces(spans: list[Got], step: str) -> dict[bytes, set[object]]:
    traces: dict[bytes, set[object]] = defaultdict(set)
    for g in spans:
        # (from 4 ranks on, each rank's detail trace starts with a synthetic copy of the step)
        if g.span.name == step and not g.span.parent_span_id and not g.attr("otelprof.synthetic"):
            traces[g.span.trace_id].add(g.resource.get("otelprof.distributed.rank"))
    return traces


@pytest.mark.slow
def test_the_same_step_of_two_ranks_is_one_trace(everything: Imported) -> None:
    pair = [
        g
        for g in everything.spans
        if str(g.resource["otelprof.run.id"]).startswith("kineto/hta__tests__data__trace_filter__sampled#")
    ]
    for step in ("ProfilerStep#551", "ProfilerStep#552"):
        assert list(_step_traces(pair, step).values()) == [{0, 1}]
    dlrm = [g for g in everything.spans if "dlrm_kineto" in str(g.resource["otelprof.run.id"])]
    assert list(_step_traces(dlrm, "ProfilerStep#10").values()) == [{0, 1}]
    # an unrelated trace with the same step number stays in its own trace
    all_551 = _step_traces(everything.spans, "ProfilerStep#551")
    assert len(all_551) == 2 and {34} in all_551.values()


def test_reimport_gives_the_same_ids(tmp_path: Path) -> None:
    files = [shared("sampled_rank-0"), shared("sampled_rank-1"), shared("saxpy", NSYS)]
    first = _import(tmp_path / "a", "--detail", "full", *files)
    second = _import(tmp_path / "b", "--detail", "full", *files)

    def key(g: Got) -> tuple[bytes, bytes, bytes, str, int, int]:
        s = g.span
        return (s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_time_unix_nano, s.end_time_unix_nano)

    assert first.code == second.code == 0
    assert len(first.spans) > 7000
    assert sorted(map(key, first.spans)) == sorted(map(key, second.spans))
