"""nvprof profiles (the SQLite torch.autograd.profiler.load_nvprof reads), checked against the
fixture's own rows and against torch's own parser reading the same file."""

from __future__ import annotations

from pathlib import Path

import pytest

from otelprof.converter import ConvertOptions
from otelprof.importer import find_sources
from otelprof.importer.nsys import convert_nsys
from otelprof.importer.nvprof import demangle
from otelprof.importer.nvtx_markup import parse
from otelprof.otlp.names import fold_kernel_name

from .helpers import Got, decode
from .make_nvtx_fixture import KERNEL, NVPROF_PID, NVPROF_TID, Call, Op, make_nvprof_fixture


@pytest.fixture(scope="module")
def nvprof_fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Op], list[Call], list[Got]]:
    path = tmp_path_factory.mktemp("nvprof") / "emit-nvtx.nvvp"
    ops, calls = make_nvprof_fixture(path)
    result = convert_nsys(path, ConvertOptions(run_id="nvprof", detail="full"))
    assert result.stats["links"] == 3
    return path, ops, calls, decode(result.requests)


def _span_at(spans: list[Got], start: int, end: int) -> Got:
    [got] = [g for g in spans if (g.span.start_time_unix_nano, g.span.end_time_unix_nano) == (start, end)]
    return got


def test_ops_calls_and_kernels_become_one_process_trace(
    nvprof_fixture: tuple[Path, list[Op], list[Call], list[Got]],
) -> None:
    _, ops, calls, spans = nvprof_fixture
    by_id = {g.span.span_id: g for g in spans}
    assert len({g.span.trace_id for g in spans}) == 1
    [root] = [g for g in spans if not g.span.parent_span_id]
    assert (root.span.name, root.category, root.resource["process.pid"]) == (
        f"process {NVPROF_PID}", "Trace", NVPROF_PID,
    )  # fmt: skip
    assert root.resource["otelprof.source.format"] == "nvprof-sqlite 11"
    assert len(spans) == 1 + len(ops) + 2 * len(calls)
    by_key = {op.key: _span_at(spans, op.start, op.end) for op in ops}
    for op in ops:
        got = by_key[op.key]
        assert (got.span.name, got.attr("otelprof.op.sequence_number"), got.attr("otelprof.op.input_dims")) == (
            op.name, op.seq, op.dims,
        ), op.key  # fmt: skip
        assert got.attr("thread.id") == NVPROF_TID
        parent = by_id[got.span.parent_span_id]
        assert parent.span.span_id == (by_key[op.parent].span.span_id if op.parent else root.span.span_id), op.key
        want = [] if op.link is None else [(by_key[op.link].span.trace_id, by_key[op.link].span.span_id)]
        assert [(link.trace_id, link.span_id) for link in got.span.links] == want, op.key
    kernel_name = demangle(KERNEL)
    for c in calls:
        call = _span_at(spans, c.start, c.end)
        device = _span_at(spans, c.device_start, c.device_end)
        assert device.span.parent_span_id == call.span.span_id
        assert (call.attr("otelprof.gpu.cbid"), call.attr("otelprof.gpu.correlation_id")) == (c.cbid, c.correlation)
        if c.kind == "kernel":
            assert call.span.name == "cudaLaunchKernel"
            assert (device.category, device.span.name) == ("kernel", fold_kernel_name(kernel_name))
            assert device.attr("otelprof.gpu.kernel_name") == (kernel_name if "(" in kernel_name else None)
            assert (device.attr("otelprof.gpu.grid"), device.attr("otelprof.gpu.block")) == ("[2,1,1]", "[256,1,1]")
            assert by_id[call.span.parent_span_id].span.name in {"aten::addmm", "aten::mm", "ThresholdBackward"}
        else:
            assert call.span.name == "cudaMemcpy"
            assert (device.category, device.span.name) == ("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)")
            assert (device.attr("otelprof.gpu.bytes"), call.span.parent_span_id) == (4096, root.span.span_id)


def test_kernel_names_are_demangled_where_libstdcxx_is_there() -> None:
    name = demangle(KERNEL)
    assert name in {"saxpy(int, float, float*, float*)", KERNEL}
    assert demangle("aten::mm") == "aten::mm"  # not mangled: left alone


def test_torch_load_nvprof_reads_the_same_ranges_and_kernels(
    nvprof_fixture: tuple[Path, list[Op], list[Call], list[Got]],
) -> None:
    """torch's own reader: each range it finds is a span of the same name (markup removed) and
    times, and the kernels it charges to the range are the kernels launched under that span."""
    torch = pytest.importorskip("torch")
    path, ops, _, spans = nvprof_fixture
    events = torch.autograd.profiler.load_nvprof(str(path))
    assert len(events) == len(ops)
    children: dict[bytes, list[Got]] = {}
    for g in spans:
        children.setdefault(g.span.parent_span_id, []).append(g)

    def kernel_durations(span: Got) -> list[int]:
        out, todo = [], [span]
        while todo:
            for c in children.get(todo.pop().span.span_id, []):
                if c.category == "kernel":
                    out.append(c.span.end_time_unix_nano - c.span.start_time_unix_nano)
                todo.append(c)
        return sorted(out)

    charged = 0
    for evt in events:
        got = _span_at(spans, evt.time_range.start, evt.time_range.end)
        markup = parse(evt.name)
        assert got.span.name == (markup.name if markup is not None else evt.name)
        assert kernel_durations(got) == sorted(k.duration for k in evt.kernels), evt.name
        charged += len(evt.kernels)
    assert charged > 3  # kernels are charged to every enclosing range, not only the innermost


def test_import_finds_nvprof_files_in_folders(tmp_path: Path) -> None:
    make_nvprof_fixture(tmp_path / "run.nvvp")
    make_nvprof_fixture(tmp_path / "other.prof")
    (tmp_path / "profile.prof").write_bytes(b"cProfile output, not SQLite")  # skipped: not a database
    found = find_sources([tmp_path])
    assert [(s.path.name, s.kind) for s in found] == [("other.prof", "nsys"), ("run.nvvp", "nsys")]


def test_otelprof_import_sends_both_fixtures_to_a_real_receiver(tmp_path: Path) -> None:
    """``otelprof import FOLDER`` finds the nvprof profile and the nsys copy and sends the ops,
    links included, to an OTLP/HTTP receiver (full detail: at default detail the shortest ops,
    under 10 µs, fold into their parents)."""
    from export.receivers import http_receiver

    from .helpers import NSYS, import_env, received, run_import, shared
    from .make_nvtx_fixture import SAXPY, make_nsys_fixture

    folder = tmp_path / "traces"
    folder.mkdir()
    nvprof_ops, _ = make_nvprof_fixture(folder / "emit-nvtx.nvvp")
    nsys_ops = make_nsys_fixture(NSYS, folder / shared(SAXPY, NSYS).name)
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        assert run_import(folder, "--detail", "full", "--ledger", tmp_path / "ledger.json", "-q") == 0
    spans = received(rec.requests)
    formats = {g.resource["otelprof.source.format"] for g in spans}
    assert formats == {"nvprof-sqlite 11", "nsys-sqlite 2.9.1"}
    for fmt, ops in (("nvprof-sqlite 11", nvprof_ops), ("nsys-sqlite 2.9.1", nsys_ops)):
        mine = [g for g in spans if g.resource["otelprof.source.format"] == fmt]
        by_id = {g.span.span_id: g for g in mine}
        assert sorted(g.span.name for g in mine if g.category == "cpu_op") == sorted(
            op.name for op in ops if op.key != "user"
        )
        pairs = sorted((g.span.name, by_id[link.span_id].span.name) for g in mine for link in g.span.links)
        assert pairs == [("AddmmBackward0", "aten::addmm"), ("TBackward0", "aten::t"), ("ThresholdBackward", "relu")]
