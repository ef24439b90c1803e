"""``otelprof import`` with execution traces: a pair recorded by torch (CPU) is recognised by
content, paired by name or by rank, and joined (the op spans carry the execution trace's own
shapes and dtypes, on both engines); an execution trace without a partner, and a Kineto trace
beside execution traces with none of its own, are counted, never guessed."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from otelprof.converter import ConvertOptions, convert
from otelprof.converter.execution_trace import op_attributes, read_execution_trace
from otelprof.importer import Importer, Ledger, find_sources
from otelprof.importer.discover import EXECUTION_TRACE, KINETO

from .helpers import decode
from .test_pipeline import Sink

torch = pytest.importorskip("torch")

OPTIONS = ConvertOptions(detail="full")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A Kineto trace and the execution trace recorded with it, by torch's own profiler."""
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

    folder = tmp_path_factory.mktemp("recorded")
    kineto, et_path = folder / "k.json", folder / "e.json"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=observer) as prof:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    prof.export_chrome_trace(str(kineto))
    return kineto, et_path


def _place(src: Path, dst: Path, zipped: bool = False) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if zipped:
        dst.write_bytes(gzip.compress(src.read_bytes()))
    else:
        shutil.copy(src, dst)
    return dst


def _import(sources: list[Any], tmp_path: Path, engine: str = "auto") -> tuple[Any, list[Any]]:
    sink = Sink()
    importer = Importer(
        sink, Ledger(tmp_path / "ledger.json"), lambda s: dataclasses.replace(OPTIONS, run_id=s.run_id), engine=engine
    )
    report = importer.run(sources)
    return report, decode(sink.submitted)


def _nodes(et_path: Path) -> dict[int, dict[str, Any]]:
    data = et_path.read_bytes()
    doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return {n["id"]: n for n in doc["nodes"]}


@pytest.mark.parametrize("engine", ["reference", pytest.param("native", marks=pytest.mark.native)])
def test_a_pair_by_name_joins_every_op(recorded: tuple[Path, Path], tmp_path: Path, engine: str) -> None:
    if engine == "native":
        from converter_helpers import skip_unless_native

        skip_unless_native()
    kineto = _place(recorded[0], tmp_path / "in" / "train.pt.trace.json")
    et = _place(recorded[1], tmp_path / "in" / "train.et.json.gz", zipped=True)  # the name says nothing of its kind
    [source] = find_sources([tmp_path / "in"])
    assert (source.kind, source.execution_trace, source.execution_trace_missing) == (KINETO, et, False)
    report, spans = _import([source], tmp_path, engine)
    events = json.loads(kineto.read_text())["traceEvents"]
    with_rf = [e for e in events if e.get("ph") == "X" and "Record function id" in e.get("args", {})]
    joined = [g for g in spans if g.attr("otelprof.et.node_id") is not None]
    assert with_rf and len(joined) == len(with_rf) == report.et_ops_joined
    assert (report.et_nodes_unmatched, report.et_ops_missing, report.execution_traces_unpaired) == (0, 0, 0)
    nodes = _nodes(et)
    for g in joined:
        node = nodes[g.attr("otelprof.et.node_id")]
        assert g.span.name == node["name"]
        assert json.loads(str(g.attr("otelprof.et.input_shapes"))) == node["inputs"]["shapes"]
        assert json.loads(str(g.attr("otelprof.et.input_types"))) == node["inputs"]["types"]
        assert json.loads(str(g.attr("otelprof.et.output_types"))) == node["outputs"]["types"]
    roots = {g.attr("otelprof.execution_trace.file") for g in spans if not g.span.parent_span_id}
    assert roots == {str(et)}
    # the same attributes as a conversion given the execution trace's own
    direct = convert(
        kineto,
        engine=engine,
        options=ConvertOptions(detail="full", op_attributes=op_attributes(read_execution_trace(et))),
    )
    want = sorted((g.span.name, g.span.start_time_unix_nano, str(g.attr("otelprof.et.input_shapes"))) for g in joined)
    got = sorted(
        (g.span.name, g.span.start_time_unix_nano, str(g.attr("otelprof.et.input_shapes")))
        for g in decode(direct.requests)
        if g.attr("otelprof.et.node_id") is not None
    )
    assert got == want


def test_pairs_by_rank_and_counts_the_unpaired(recorded: tuple[Path, Path], tmp_path: Path) -> None:
    folder = tmp_path / "ranks"
    k0 = _place(recorded[0], folder / "kineto_rank-0.json")
    e0 = _place(recorded[1], folder / "et_rank-0.json")  # PARAM's way: a rank in the name
    k1 = _place(recorded[0], folder / "kineto_rank-1.json")  # no execution trace of its own
    e7 = _place(recorded[1], folder / "et_rank-7.json")  # no Kineto trace of its rank
    sources = {s.path: s for s in find_sources([folder])}
    assert sources[k0].execution_trace == e0 and not sources[k0].execution_trace_missing
    assert sources[k1].execution_trace is None and sources[k1].execution_trace_missing
    assert sources[e7].kind == EXECUTION_TRACE and e0 not in sources
    report, spans = _import(list(sources.values()), tmp_path)
    assert (report.execution_traces_unpaired, report.kineto_without_execution_trace) == (1, 1)
    assert report.files_sent == 2 and report.files_failed == 0
    files = {g.attr("otelprof.execution_trace.file") for g in spans if not g.span.parent_span_id}
    assert files == {str(e0), None}


def test_an_execution_trace_alone_is_not_imported(recorded: tuple[Path, Path], tmp_path: Path) -> None:
    et = _place(recorded[1], tmp_path / "alone" / "trace.json")
    [source] = find_sources([et])
    assert source.kind == EXECUTION_TRACE
    report, spans = _import([source], tmp_path)
    assert (report.execution_traces_unpaired, report.files_sent, report.files_failed, spans) == (1, 0, 0, [])
