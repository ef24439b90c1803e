"""Length limits on imports: an Nsight Systems export and an nvprof profile whose strings are
huge (a 5,000,000-character NVTX range; kernel, CUDA API, process, host and GPU names;
``emit_nvtx`` shapes; an NVTX domain name, read and not sent) send what the Kineto converter
sends for the same strings: names and values cut to the same characters, requests under
``max_request_bytes``, no span lost (full detail: every row a span)."""

from __future__ import annotations

import gzip
import json
import sqlite3
from contextlib import closing
from functools import cache
from pathlib import Path

import pytest

from otelprof.cli.import_ import HTTP_IMPORT_REQUEST_BYTES
from otelprof.converter import ConvertOptions, convert
from otelprof.converter._options import DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
from otelprof.importer.nsys import convert_nsys

from .helpers import KINETO, NSYS, Got, decode, import_env, received, run_import, shared
from .make_nvtx_fixture import SAXPY, make_nvprof_fixture

LIMIT = DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
MANY = 200  # ranges whose names are one character over the limit
#: A Collector refuses a request over 4 MiB (its default gRPC receive limit).
COLLECTOR_LIMIT = 4 * 1024 * 1024


def _huge(tag: str, n: int) -> str:
    """``n`` characters, two-byte ones among them (a cut in bytes would show)."""
    return (tag + "-" + "é" * n)[:n]


RANGE = _huge("range", 5_000_000)
API = _huge("cudaHugeCall", 1_000_000)
KERNEL = "void huge_kernel<" + "float, " * 100_000 + "int>(float*, int)"
DOMAIN, HOST, GPU = _huge("domain", 1_000_000), _huge("host", 1_000_000), _huge("gpu", 1_000_000)
PROCESS = "./" + _huge("proc", 1_000_000)
VERSION = "2.9.1" + _huge("", 1_000_000)  # EXPORT_SCHEMA_VERSION: still major 2
DIMS = "[[" + ",".join(["7"] * 400_000) + "]]"  # otelprof.op.input_dims, compact JSON
SHAPES_OP = "aten::cat, seq = 5, op_id = 9, sizes = [[" + ", ".join(["7"] * 400_000) + "]]"


#: Characters of a span name (a longer one is cut, its last character an ellipsis).
SHOWN = 128


def _shown(name: str) -> str:
    return name if len(name) <= SHOWN else name[: SHOWN - 1] + "\N{HORIZONTAL ELLIPSIS}"


def _many(i: int) -> str:
    return f"{i:03d}" + "m" * (LIMIT - 2)


def _nsys_fixture(dst: Path) -> int:
    """The shared saxpy export with the huge strings; returns its spans' count at full detail
    (by plain SQL; the domain's name is no span's)."""
    dst.write_bytes(shared(SAXPY, NSYS).read_bytes())
    with closing(sqlite3.connect(dst)) as db, db:
        tid, pid, s1, e1, s2, e2, last = db.execute(
            "SELECT r.globalTid, r.globalTid >> 24 & 16777215, min(r.start), min(r.end), max(r.start), max(r.end), "
            "(SELECT max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            "JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE 'cudaLaunchKernel%' AND r.eventClass = 0"
        ).fetchone()
        (sid,) = db.execute("SELECT max(id) FROM StringIds").fetchone()
        db.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)", [(sid + 1, RANGE), (sid + 2, API)])
        db.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (sid + 3, KERNEL))
        nvtx = "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text, textId, domainId) VALUES "
        db.execute(nvtx + "(?, NULL, 75, ?, ?, NULL, 77)", (s1, tid, DOMAIN))
        db.execute(nvtx + "(?, ?, 59, ?, NULL, ?, 77)", (s1 - 9000, e1 + 9000, tid, sid + 1))
        db.execute(nvtx + "(?, ?, 59, ?, ?, NULL, 0)", (s2 - 9000, e2 + 9000, tid, SHAPES_OP))
        spread = [(last + 1000 + 10 * i, last + 1005 + 10 * i, tid, _many(i)) for i in range(MANY)]
        db.executemany(nvtx + "(?, ?, 60, ?, ?, NULL, 0)", spread)
        db.execute(
            "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET nameId = ? WHERE rowid = "
            "(SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 0)",
            (sid + 2,),
        )
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = ? WHERE rowid = 1", (sid + 3,))
        db.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", (HOST,))
        db.execute("UPDATE TARGET_INFO_GPU SET name = ?", (GPU,))
        db.execute("UPDATE PROCESSES SET name = ? WHERE pid = ?", (PROCESS, pid))
        db.execute("UPDATE EXPORT_META_DATA SET value = ? WHERE name = 'EXPORT_SCHEMA_VERSION'", (VERSION,))
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        rows = [
            "CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1)", "CUPTI_ACTIVITY_KIND_KERNEL",
            "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
            "NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL",
        ]  # fmt: skip
        counts = (int(db.execute(f"SELECT count(*) FROM {r}").fetchone()[0]) for r in rows if r.split()[0] in tables)
        return 1 + sum(counts)  # and the process root


def _nvprof_fixture(dst: Path) -> int:
    """The emit_nvtx nvprof fixture with the huge strings; returns its spans' count."""
    ops, calls = make_nvprof_fixture(dst)
    with closing(sqlite3.connect(dst)) as db, db:
        (thread,) = db.execute("SELECT objectId FROM CUPTI_ACTIVITY_KIND_MARKER LIMIT 1").fetchone()
        (mid, end) = db.execute("SELECT max(id), max(timestamp) FROM CUPTI_ACTIVITY_KIND_MARKER").fetchone()
        texts = [RANGE, SHAPES_OP, *map(_many, range(MANY))]
        db.executemany("INSERT INTO StringTable (value) VALUES (?)", [(t,) for t in [*texts, DOMAIN, KERNEL, GPU]])
        ids = dict(db.execute("SELECT value, _id_ FROM StringTable WHERE length(value) > ?", (LIMIT,)))
        marker = "INSERT INTO CUPTI_ACTIVITY_KIND_MARKER (flags, timestamp, id, objectKind, objectId, name, domain) "
        for k, text in enumerate(texts, start=mid + 1):
            ts = end + 1000 + 10 * k
            db.execute(
                marker + "VALUES (2, ?, ?, 2, ?, ?, ?)", (ts, k, thread, ids[text], ids[DOMAIN] if k == mid + 1 else 0)
            )
            db.execute(marker + "VALUES (4, ?, ?, 2, ?, 0, 0)", (ts + 5, k, thread))
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL SET name = ? WHERE _id_ = 1", (ids[KERNEL],))
        db.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_DEVICE(_id_ INTEGER PRIMARY KEY, id INT NOT NULL, name INT NOT NULL)"
        )
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_DEVICE (id, name) VALUES (0, ?)", (ids[GPU],))
    return 1 + len(ops) + 2 * len(calls) + len(texts)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """A folder holding both files; each file's name -> its spans' count."""
    folder = tmp_path_factory.mktemp("huge") / "traces"
    folder.mkdir()
    return folder, {
        "saxpy.sqlite": _nsys_fixture(folder / "saxpy.sqlite"),
        "huge.nvvp": _nvprof_fixture(folder / "huge.nvvp"),
    }


@cache
def _kineto(max_bytes: int) -> dict[str, object]:
    """What the Kineto converter makes of the same strings: the real AlexNet trace with its first
    user annotation, CUDA runtime call and kernel renamed, its host and GPUs named."""
    doc = json.loads(gzip.decompress(shared("critical_path__alexnet", KINETO).read_bytes()))
    for cat, name in (("user_annotation", RANGE), ("cuda_runtime", API), ("kernel", KERNEL)):
        next(e for e in doc["traceEvents"] if e.get("cat") == cat)["name"] = name
    doc["host_name"] = HOST
    for device in doc["deviceProperties"]:
        device["name"] = GPU
    result = convert(json.dumps(doc, ensure_ascii=False).encode(), detail="full", max_request_bytes=max_bytes)
    spans = decode(result.requests)
    [kernel] = [
        g for g in spans if g.category == "kernel" and str(g.attr("otelprof.gpu.kernel_name")).startswith("void huge")
    ]
    return {
        "range": _named(spans, "range-").span.name,
        "api": _named(spans, "cudaHugeCall").span.name,
        "kernel": kernel.span.name,
        "kernel_name": kernel.attr("otelprof.gpu.kernel_name"),
        "host": spans[0].resource["host.name"],
        "gpu": spans[0].resource["otelprof.gpu.model"],
    }


def _named(spans: list[Got], prefix: str) -> Got:
    [got] = [g for g in spans if g.span.name.startswith(prefix)]
    return got


def _check(spans: list[Got], count: int, max_bytes: int, nvprof: bool) -> None:
    """The file's spans: none lost, each huge string cut as the Kineto converter cuts it."""
    kineto, share = _kineto(max_bytes), min(LIMIT, max_bytes // 64)
    assert len(spans) == count
    assert len({g.span.span_id for g in spans}) == count
    huge = _named(spans, "range-")
    assert huge.span.name == kineto["range"]
    assert len(huge.span.name) == SHOWN  # the whole, cut at the attribute limit, in otelprof.event.name
    assert huge.attr("otelprof.event.name") == str(huge.attr("otelprof.event.name"))[:LIMIT]
    [kernel] = [g for g in spans if str(g.attr("otelprof.gpu.kernel_name")).startswith("void huge")]
    assert (kernel.span.name, kernel.attr("otelprof.gpu.kernel_name")) == (kineto["kernel"], kineto["kernel_name"])
    assert _named(spans, "aten::cat").attr("otelprof.op.input_dims") == DIMS[:LIMIT]
    whole = [
        str(g.attr("otelprof.event.name")) for g in spans if str(g.attr("otelprof.event.name")).endswith("m" * 100)
    ]
    assert sorted(whole) == [_many(i)[:LIMIT] for i in range(MANY)]
    assert sorted(g.span.name for g in spans if str(g.attr("otelprof.event.name")).endswith("m" * 100)) == [
        _shown(_many(i)) for i in range(MANY)
    ]
    resource = spans[0].resource
    assert resource["otelprof.gpu.model"] == kineto["gpu"] == GPU[:share]
    if nvprof:
        return
    assert _named(spans, "cudaHugeCall").span.name == kineto["api"]
    assert resource["host.name"] == kineto["host"] == HOST[:share]
    assert resource["process.executable.path"] == PROCESS[:share]
    assert resource["otelprof.source.format"] == ("nsys-sqlite " + VERSION)[:share]
    [root] = [g for g in spans if not g.span.parent_span_id]
    assert root.span.name == _shown(Path(PROCESS).name)


def test_otelprof_import_cuts_as_the_converter_and_stays_under_the_request_limit(
    files: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    """Before: the 5M-character range and the megabyte host, GPU and process names went out
    whole, one span per 14-20 MB request, refused by a Collector (here a receiver answering 413
    over 4 MiB), so the import failed."""
    from export.receivers import HttpReceiver, http_receiver

    folder, counts = files
    with http_receiver(HttpReceiver(max_body_bytes=COLLECTOR_LIMIT)) as rec, import_env(tmp_path, rec.port):
        assert run_import(folder, "--detail", "full", "--ledger", tmp_path / "ledger.json", "-q") == 0
    assert rec.requests and all(r.ByteSize() <= HTTP_IMPORT_REQUEST_BYTES for r in rec.requests)
    spans = received(rec.requests)
    for name, nvprof in (("huge.nvvp", True), ("saxpy.sqlite", False)):
        mine = [g for g in spans if str(g.resource["otelprof.source.format"]).startswith("nvprof") == nvprof]
        _check(mine, counts[name], HTTP_IMPORT_REQUEST_BYTES, nvprof)


@pytest.mark.parametrize("name", ["saxpy.sqlite", "huge.nvvp"])
def test_small_request_limits_bound_every_request_and_count_each_cut(
    files: tuple[Path, dict[str, int]], name: str
) -> None:
    """A 64 KiB limit: resource values keep 1/64 of it, as in a converted Kineto trace, so even
    the span holding the cut 5M-character range fits with them in one request."""
    folder, counts = files
    max_bytes = 64 * 1024
    result = convert_nsys(folder / name, ConvertOptions(run_id="limits", max_request_bytes=max_bytes, detail="full"))
    assert max(map(len, result.requests)) <= max_bytes
    assert result.stats["spans"] == counts[name]
    _check(decode(result.requests), counts[name], max_bytes, name.endswith(".nvvp"))
    # range, kernel_name, input_dims, the MANY ranges and the GPU model; nsys adds the CUDA
    # call, the root's name and the host, executable path and source format
    cuts = 4 + MANY + (0 if name.endswith(".nvvp") else 5)
    assert result.stats["values_truncated"] == cuts
