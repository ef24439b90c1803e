"""``otelprof import --run-id`` of unrelated traces into a real OTLP/HTTP receiver: files of one
rank under one run id never share a (trace id, span id) (they did: 11,033 of 434k ids), and a
second import gives the same ids."""

from __future__ import annotations

import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from export.receivers import http_receiver

from .helpers import SHARED, Got, import_env, received, run_import, shared

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")

#: Unrelated traces: three of rank 0 (distributedInfo) and three without a rank, some of them
#: with no ProfilerStep at all (every span in the window trace, where ordinals overlapped).
FILES = (
    "critical_path__alexnet",
    "sampled_rank-0",
    "worker0_step_12",
    "amd_trace__mi250",
    "gaunernst_bert",
    "mi300__ddp_resnet18",
)


def _import(tmp_path: Path, folder: Path) -> list[Got]:
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        code = run_import(folder, "--run-id", "ref", "--detail", "full", "--ledger", tmp_path / "ledger.json", "-q")
    assert code == 0
    return received(rec.requests)


def test_unrelated_files_under_one_run_id_keep_their_ids_apart(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    for fragment in FILES:
        shutil.copy(shared(fragment), folder)
    first = _import(tmp_path / "a", folder)
    ranks = Counter(g.resource.get("otelprof.distributed.rank") for g in first)
    assert set(ranks) == {0, None}
    owners: dict[tuple[bytes, bytes], set[tuple[str, int]]] = defaultdict(set)
    for g in first:
        assert g.resource["otelprof.run.id"] == "ref"
        owners[(g.span.trace_id, g.span.span_id)].add((g.span.name, g.span.start_time_unix_nano))
    assert len(first) > 12000
    assert len(owners) == len(first), f"{len(first) - len(owners)} spans share an id with another"
    second = _import(tmp_path / "b", folder)

    def key(g: Got) -> tuple[bytes, bytes, bytes, str]:
        return (g.span.trace_id, g.span.span_id, g.span.parent_span_id, g.span.name)

    assert sorted(map(key, first)) == sorted(map(key, second))
