"""emit_nvtx ranges in an Nsight Systems export (a copy of the shared saxpy export with torch's
NVTX rows added, tests/importer/make_nvtx_fixture.py): op names, attributes, parents, links,
at full detail (every row a span)."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from otelprof.converter import ConvertOptions
from otelprof.importer import find_sources
from otelprof.importer.nsys import convert_nsys

from .helpers import NSYS, Got, decode, shared
from .make_nvtx_fixture import SAXPY, Op, make_nsys_fixture


@pytest.fixture(scope="module")
def nsys_fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Op]]:
    original = shared(SAXPY, NSYS)  # skips when ../shared is missing
    path = tmp_path_factory.mktemp("nvtx") / original.name  # same name: same trace and span ids
    return path, make_nsys_fixture(NSYS, path)


def _convert(path: Path) -> tuple[list[Got], dict[str, int]]:
    result = convert_nsys(path, ConvertOptions(run_id="nvtx", detail="full"))
    return decode(result.requests), result.stats


def test_ops_get_their_names_attributes_parents_and_links(nsys_fixture: tuple[Path, list[Op]]) -> None:
    path, ops = nsys_fixture
    spans, stats = _convert(path)
    with sqlite3.connect(path) as db:
        (base,) = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        (tid,) = db.execute("SELECT DISTINCT globalTid & 16777215 FROM NVTX_EVENTS WHERE textId IS NOT NULL").fetchone()
    by_id = {g.span.span_id: g for g in spans}
    by_key: dict[str, Got] = {}
    for op in ops:
        [got] = [
            g
            for g in spans
            if (g.span.start_time_unix_nano, g.span.end_time_unix_nano) == (base + op.start, base + op.end)
        ]
        by_key[op.key] = got
        assert got.span.name == op.name, op.key
        assert got.attr("otelprof.op.sequence_number") == op.seq, op.key
        assert got.attr("otelprof.op.input_dims") == op.dims, op.key
        assert got.attr("otelprof.op.fwd_thread_id") == (tid if op.link is not None else None), op.key
        assert got.attr("thread.id") == tid, op.key
        assert got.category == ("user_annotation" if op.key == "user" else "cpu_op"), op.key
    for op in ops:
        got = by_key[op.key]
        parent = by_id[got.span.parent_span_id]
        if op.parent is not None:
            assert parent.span.span_id == by_key[op.parent].span.span_id, op.key
        else:  # inside the saxpy range the export already had
            assert (parent.category, parent.span.name) == ("user_annotation", "saxpy"), op.key
        links = [(link.trace_id, link.span_id) for link in got.span.links]
        if op.link is None:
            assert links == [], op.key
        else:
            target = by_key[op.link].span
            assert links == [(target.trace_id, target.span_id)], op.key
            assert [kv.value.string_value for kv in got.span.links[0].attributes] == ["fwdbwd"]
        if op.launches:  # the launch and its saxpy kernel hang under the op
            [launch] = [g for g in spans if g.span.parent_span_id == got.span.span_id and g.category == "cuda_runtime"]
            assert launch.span.name == "cudaLaunchKernel"
            [kernel] = [g for g in spans if g.span.parent_span_id == launch.span.span_id]
            assert (kernel.category, kernel.span.name) == ("kernel", "saxpy")  # the name folded, in full below
            assert kernel.attr("otelprof.gpu.kernel_name") == "saxpy(double *, double *, double *, double, int)"
    assert stats["links"] == 3
    assert stats["nvtx_ops"] == len(ops) - 1  # all but the user range


def test_the_original_spans_are_unchanged(nsys_fixture: tuple[Path, list[Op]]) -> None:
    """The added rows change nothing else: every original row is still a span of the same name,
    category and times (ids change: the converter derives them from the whole trace)."""
    path, ops = nsys_fixture

    def key(g: Got) -> tuple[str, object, int, int]:
        return (g.span.name, g.category, g.span.start_time_unix_nano, g.span.end_time_unix_nano)

    before = Counter(map(key, decode(convert_nsys(shared(SAXPY, NSYS), ConvertOptions(detail="full")).requests)))
    after = Counter(map(key, _convert(path)[0]))
    assert sum(after.values()) - sum(before.values()) == len(ops)
    assert not before - after


def test_import_discovers_the_fixture_as_an_nsys_export(nsys_fixture: tuple[Path, list[Op]]) -> None:
    path, _ = nsys_fixture
    [source] = find_sources([path.parent])
    assert (source.path, source.kind) == (path, "nsys")
