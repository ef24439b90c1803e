"""Bad input: one line on stderr naming the file, exit 1, nothing of that file sent; the good
files of the same import still arrive, complete."""

from __future__ import annotations

import gzip
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from export.receivers import HttpReceiver, http_receiver

from otelprof.converter import convert

from .helpers import NSYS, decode, ids, import_env, received, run_id_of, run_import, shared


@pytest.fixture(scope="module")
def shared_receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


@pytest.fixture
def rec(shared_receiver: HttpReceiver) -> HttpReceiver:
    """One receiver for the module (each stops in 0.5 s), emptied for every test."""
    with shared_receiver.lock:
        shared_receiver.requests.clear()
    return shared_receiver


def _not_json(d: Path) -> Path:
    (d / "notes.json").write_text("hello, world\n")
    return d / "notes.json"


def _json_not_a_trace(d: Path) -> Path:
    (d / "config.json").write_text('{"lr": 0.001, "epochs": 3}')
    return d / "config.json"


def _truncated_gzip(d: Path) -> Path:
    data = shared("alexnet").read_bytes()
    (d / "cut.json.gz").write_bytes(data[: len(data) // 2])
    return d / "cut.json.gz"


def _gzip_of_garbage(d: Path) -> Path:
    (d / "garbage.json.gz").write_bytes(gzip.compress(b"\x00\x01 not json"))
    return d / "garbage.json.gz"


def _empty_file_sqlite(d: Path) -> Path:
    (d / "empty.sqlite").write_bytes(b"")
    return d / "empty.sqlite"


def _sqlite(path: Path, *statements: str) -> Path:
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 1")  # makes the file a real, if empty, database
    for sql in statements:
        db.execute(sql)
    db.commit()
    db.close()
    return path


def _empty_sqlite(d: Path) -> Path:
    return _sqlite(d / "no_tables.sqlite")


def _other_sqlite(d: Path) -> Path:
    return _sqlite(d / "mlflow.sqlite", "CREATE TABLE runs (id INTEGER, name TEXT)")


def _unknown_schema(d: Path) -> Path:
    return _sqlite(
        d / "future.sqlite",
        "CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT)",
        "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '9.1.0')",
        "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)",
    )


def _no_events(d: Path) -> Path:
    return _sqlite(
        d / "idle.sqlite",
        "CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT)",
        "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.13.2')",
        "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)",
    )


def _truncated_sqlite(d: Path) -> Path:
    data = shared("cloverleaf", NSYS).read_bytes()
    (d / "cut.sqlite").write_bytes(data[: len(data) // 3])
    return d / "cut.sqlite"


def _text_named_sqlite(d: Path) -> Path:
    (d / "report.sqlite").write_text("not a database at all\n")
    return d / "report.sqlite"


BAD: dict[str, tuple[Callable[[Path], Path], str]] = {
    "not_json": (_not_json, "JSON"),
    "json_not_a_trace": (_json_not_a_trace, "traceEvents"),
    "truncated_gzip": (_truncated_gzip, "truncated gzip"),
    "gzip_of_garbage": (_gzip_of_garbage, "JSON"),
    "empty_file_sqlite": (_empty_file_sqlite, "empty file"),
    "sqlite_without_tables": (_empty_sqlite, "empty SQLite database"),
    "unrelated_sqlite": (_other_sqlite, "not an Nsight Systems SQLite export"),
    "unknown_schema": (_unknown_schema, "unsupported Nsight Systems export schema '9.1.0'"),
    "export_without_events": (_no_events, "no CUDA or NVTX events"),
    "truncated_sqlite": (_truncated_sqlite, "not a readable SQLite database"),
    "text_named_sqlite": (_text_named_sqlite, "not a readable SQLite database"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_alone_one_line_exit_1_nothing_sent(
    case: str, tmp_path: Path, rec: HttpReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    make, reason = BAD[case]
    bad = make(tmp_path)
    with import_env(tmp_path, rec.port):
        code = run_import(bad, "-q")
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1, err
    assert err.startswith(f"otelprof: error: {bad}: ") and reason in err, err
    assert rec.requests == []


@pytest.mark.parametrize("case", ["truncated_gzip", "unknown_schema", "truncated_sqlite"])
def test_good_files_around_a_bad_one_arrive_complete(
    case: str, tmp_path: Path, rec: HttpReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = BAD[case][0](tmp_path)
    good = shared("amd_trace")
    with import_env(tmp_path, rec.port):
        code = run_import(good, bad, shared("cpu_only"), "-q")
    assert code == 1
    assert capsys.readouterr().err.count("\n") == 1
    got = ids(received(rec.requests))
    want = []
    for path in (good, shared("cpu_only")):
        want += ids(decode(convert(path, run_id=run_id_of(path)).requests))
    assert sorted(got) == sorted(want)


def test_missing_path_and_unexported_report_are_errors(
    tmp_path: Path, rec: HttpReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"\x00" * 64)
    with import_env(tmp_path, rec.port):
        assert run_import(tmp_path / "nope.json") == 1
        assert f"{tmp_path / 'nope.json'}: no such file or directory" in capsys.readouterr().err
        assert run_import(report) == 1
        assert "nsys export --type sqlite" in capsys.readouterr().err
        (tmp_path / "empty").mkdir()
        assert run_import(tmp_path / "empty") == 1
        assert "no traces found" in capsys.readouterr().err
    assert rec.requests == []


def test_a_corrupt_ledger_is_an_error_with_resume(
    tmp_path: Path, rec: HttpReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger.json"
    ledger.write_text("{not json")
    with import_env(tmp_path, rec.port):
        assert run_import(shared("amd_trace"), "--resume", "--ledger", ledger) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"otelprof: error: {ledger}: unreadable import ledger") and err.count("\n") == 1
    assert rec.requests == []
