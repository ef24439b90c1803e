"""Spools are private (issue 31, "spool"): folder 0700, files 0600, never through a symlink; a
folder another user owns, others may write, or that is a symlink is refused, never used; and
evictions are counted exactly by the process that removed each record.

Real modes, real symlinks, a real second uid (the tests run as root: ``chown`` to nobody), real
processes and a real OTLP receiver.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from converter_helpers import shared_trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from otelprof.converter import convert
from otelprof.export import ExporterConfig, exporter_config_from_env
from otelprof.export.destination import destination_id
from otelprof.export.exporter import Exporter
from otelprof.export.spool import REPLAY_LOCK, SUFFIX, Spool

from .receivers import http_receiver

NOBODY = 65534
ROOT = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another uid needs root")


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    return convert(shared_trace("critical_path"), detail="full", max_request_bytes=8 * 1024).requests[:5]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _planted() -> bytes:
    request = ExportTraceServiceRequest()
    request.resource_spans.add().scope_spans.add().spans.add(name="planted", trace_id=b"\1" * 16, span_id=b"\2" * 8)
    return request.SerializeToString()


def _config(port: int) -> ExporterConfig:
    return exporter_config_from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20victim-token",
        }
    )


def test_a_new_spool_is_0700_its_files_0600_and_parents_follow_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: folder 0755, records, description and lock 0644 (world-readable traces)."""
    umask = os.umask(0o022)
    os.umask(umask)
    spool = Spool(tmp_path / "a" / "spool")
    assert spool.store(b"x" * 10, "0123456789abcdef", {"endpoint": "http://h/"}) is None
    with spool.replay_lock() as mine:
        assert mine
    assert _mode(tmp_path / "a") == 0o777 & ~umask  # parents: as the umask makes them
    assert _mode(tmp_path / "a" / "spool") == 0o700
    files = sorted(os.listdir(tmp_path / "a" / "spool"))
    assert [f for f in files if f.endswith(SUFFIX)] and REPLAY_LOCK in files and len(files) == 3, files
    assert {f: _mode(tmp_path / "a" / "spool" / f) for f in files} == dict.fromkeys(files, 0o600)
    # the default location: ~/.cache/otelprof holds only otelprof's files, so it is 0700 too
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    Spool(tmp_path / "home" / ".cache" / "otelprof" / "spool")
    modes = [_mode(tmp_path / "home" / p) for p in (".cache", ".cache/otelprof", ".cache/otelprof/spool")]
    assert modes == [0o777 & ~umask, 0o700, 0o700]


def test_our_0755_spool_of_an_older_otelprof_is_tightened_and_still_read(tmp_path: Path) -> None:
    folder = tmp_path / "spool"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    old = folder / f"{time.time_ns():020d}-{os.getpid():07d}-{0:09d}-none{SUFFIX}"
    old.write_bytes(b"an older record")
    os.chmod(old, 0o644)
    spool = Spool(folder)
    assert [(p.name, data) for p, data in spool] == [(old.name, b"an older record")]
    assert (_mode(folder), _mode(old)) == (0o700, 0o600)


def _unsafe_folder(tmp_path: Path, kind: str, destination: str = "none") -> tuple[Path, Path]:
    """A spool folder with a record planted for the victim's destination (its id is no secret:
    every record name of the victim's carries it)."""
    real = tmp_path / ("real" if kind == "symlink" else "shared")
    real.mkdir()
    planted = real / f"{time.time_ns():020d}-0000001-{0:09d}-{destination}{SUFFIX}"
    planted.write_bytes(_planted())
    if kind == "other-owner":
        os.chown(planted, NOBODY, NOBODY)
        os.chown(real, NOBODY, NOBODY)
        os.chmod(real, 0o755)
    elif kind == "world-writable":
        os.chmod(real, 0o777)
    else:
        os.chmod(real, 0o700)
        (tmp_path / "link").symlink_to(real)
        return tmp_path / "link", planted
    return real, planted


UNSAFE = pytest.mark.parametrize(
    ("kind", "advice"),
    [
        pytest.param("other-owner", f"belongs to uid {NOBODY}", marks=needs_root),
        ("world-writable", "is writable by others (mode 0777): they could plant requests sent with your credentials; "),
        ("symlink", "is a symbolic link: set OTELPROF_SPOOL_DIR"),
    ],
)


@UNSAFE
def test_an_unsafe_spool_is_never_replayed(tmp_path: Path, requests: list[bytes], kind: str, advice: str) -> None:
    """Before: the planted record was replayed first, with the victim's bearer token."""
    with http_receiver() as rec:
        config = _config(rec.port)
        folder, planted = _unsafe_folder(tmp_path, kind, destination_id(config))
        exporter = Exporter(config, spool_dir=folder, backoff_s=0.01, max_backoff_s=0.05, probe_interval_s=0.05)
        for r in requests:
            exporter.submit(r)
        assert exporter.flush(30)
        exporter.shutdown()
    assert [r.SerializeToString() for r in rec.requests] == requests
    assert all(h["authorization"] == "Bearer victim-token" for h in rec.headers_seen)
    assert "planted" not in {s.name for s in rec.spans}
    assert sorted(os.listdir(planted.parent)) == [planted.name]  # nothing read away, nothing written
    spool = Spool(folder)
    assert (spool.records(), list(spool), spool.bytes_used()) == ([], [], 0)


@UNSAFE
def test_an_unsafe_spool_takes_nothing_and_counts_each_loss_with_one_warning(
    tmp_path: Path, requests: list[bytes], kind: str, advice: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the requests were written there (readable by the folder's owner) and counted spooled."""
    folder, planted = _unsafe_folder(tmp_path, kind)
    registry = CollectorRegistry()
    with caplog.at_level(logging.WARNING):
        exporter = Exporter(exporter_config_from_env({}), spool_dir=folder, registry=registry)  # no endpoint: spool
        for r in requests:
            exporter.submit(r)
        assert exporter.flush(30)
        exporter.shutdown()
    n = len(requests)
    assert (exporter.counters.requests_spooled, exporter.counters.dropped_by_reason) == (0, {"spool_unsafe": n})
    assert (
        registry.get_sample_value(
            "otelprof_export_dropped_requests_total", {"signal": "traces", "reason": "spool_unsafe"}
        )
        == n
    )
    assert sorted(os.listdir(planted.parent)) == [planted.name]
    lines = [r.getMessage() for r in caplog.records if str(folder) in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"spool folder refused: {folder} {advice}"), lines
    if kind == "world-writable":
        assert f"`chmod 700 {folder}`" in lines[0]


def test_a_symlink_at_the_replay_lock_is_never_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: the lock was opened through the symlink, creating a file where it pointed."""
    spool = Spool(tmp_path / "spool")
    target = tmp_path / "elsewhere" / "created-by-otelprof"
    target.parent.mkdir()
    (tmp_path / "spool" / REPLAY_LOCK).symlink_to(target)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            with spool.replay_lock() as mine:
                assert mine  # unguarded, as on a read-only spool: replayed rather than never
    assert not target.exists() and os.listdir(target.parent) == []
    assert (tmp_path / "spool" / REPLAY_LOCK).is_symlink()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(f"not locking {tmp_path / 'spool' / REPLAY_LOCK} (a symbolic link)")


@needs_root
def test_only_regular_records_of_ours_are_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: the symlink's target (a file outside the spool) was read as a record, and a
    record of another uid replayed."""
    spool = Spool(tmp_path / "spool")
    assert spool.write(b"ours")
    outside = tmp_path / "secret"
    outside.write_bytes(b"a file outside the spool")
    base = f"{time.time_ns():020d}-0000001"
    (tmp_path / "spool" / f"{base}-000000001-none{SUFFIX}").symlink_to(outside)
    foreign = tmp_path / "spool" / f"{base}-000000002-none{SUFFIX}"
    foreign.write_bytes(b"planted by uid 65534")
    os.chown(foreign, NOBODY, NOBODY)
    (tmp_path / "spool" / f"{base}-000000003-none{SUFFIX}").mkdir()
    with caplog.at_level(logging.WARNING):
        assert [data for _p, data in spool] == [b"ours"]
        assert [data for _p, data in spool] == [b"ours"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "skipped" in lines[0], lines  # logged once


_FILLER = """
import json, os, sys, time
from otelprof.export.spool import Spool
folder, go, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
spool = Spool(folder, max_bytes=64 * 1024)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
ok = sum(spool.write(bytes([i % 256]) * 200) for i in range(count))
print(json.dumps({"ok": ok, "written": spool.counters.written, "evicted": spool.counters.evicted,
                  "evicted_bytes": spool.counters.evicted_bytes}))
"""


def test_evictions_across_processes_are_counted_exactly_once(tmp_path: Path) -> None:
    """Four processes fill one 64 KiB spool. Before: a record another process had already
    removed was counted evicted again (the sum exceeded what was written minus what is left)."""
    folder, go, count = tmp_path / "spool", tmp_path / "go", 300
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_FILLER), str(folder), str(go), str(count)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    go.touch()
    results = []
    for child in children:
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0
        results.append(json.loads(out))
    assert [r["ok"] for r in results] == [count] * 4 and sum(r["written"] for r in results) == 4 * count
    left = [p for p in folder.iterdir() if p.name.endswith(SUFFIX)]
    assert sum(r["evicted"] for r in results) == 4 * count - len(left) > 0
    assert sum(r["evicted_bytes"] for r in results) == 200 * (4 * count - len(left))
