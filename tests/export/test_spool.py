"""The disk spool: ordered, bounded (oldest evicted and counted), crash-safe, failure-tolerant."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from converter_helpers import shared_trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof.converter import convert
from otelprof.export.spool import TMP_SUFFIX, Spool


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    return convert(shared_trace("alexnet"), detail="full", max_request_bytes=16 * 1024).requests


def test_records_come_back_in_order(tmp_path: Path, requests: list[bytes]) -> None:
    spool = Spool(tmp_path / "spool")
    for r in requests:
        assert spool.write(r)
    assert [data for _path, data in spool] == requests
    assert spool.bytes_used() == sum(map(len, requests))
    assert spool.counters.written == len(requests)
    first, _ = next(iter(spool))
    spool.remove(first)
    assert [data for _path, data in spool] == requests[1:]
    # a new Spool on the same directory (the next start) sees what is left
    assert [data for _path, data in Spool(tmp_path / "spool")] == requests[1:]


def test_full_spool_evicts_the_oldest_and_counts(tmp_path: Path, requests: list[bytes]) -> None:
    limit = 3 * max(map(len, requests))
    spool = Spool(tmp_path, max_bytes=limit)
    for r in requests:
        assert spool.write(r)
    kept = [data for _path, data in spool]
    assert spool.bytes_used() <= limit
    assert kept == requests[len(requests) - len(kept) :]  # the newest survive, in order
    assert spool.counters.evicted == len(requests) - len(kept) > 0
    assert spool.counters.evicted_bytes == sum(map(len, requests[: spool.counters.evicted]))


def test_oversized_request_is_refused_and_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=100)
    assert not spool.write(b"x" * 101)
    assert spool.counters.failed_writes == 1 and spool.records() == []


def test_disk_refusing_writes_is_counted_not_raised(tmp_path: Path, requests: list[bytes]) -> None:
    """A real write failure: the kernel's file-size limit (EFBIG), in a child process."""
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from otelprof.export.spool import Spool
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        spool = Spool({str(tmp_path)!r})
        ok = [spool.write(b"a" * 500), spool.write(b"b" * 5000), spool.write(b"c" * 5000)]
        print(ok, spool.counters.failed_writes, len(spool.records()))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "[True, False, False] 2 1"
    assert "spool write failed" in out.stderr and out.stderr.count("spool write failed") == 1  # logged once
    assert not list(tmp_path.glob(f"*{TMP_SUFFIX}"))


def test_sigkill_while_spooling_leaves_only_complete_records(tmp_path: Path, requests: list[bytes]) -> None:
    payload = tmp_path / "payload.bin"
    payload.write_bytes(requests[0])
    script = textwrap.dedent(
        f"""
        import sys
        from otelprof.export.spool import Spool
        spool = Spool({str(tmp_path / "spool")!r}, max_bytes=1 << 30)
        data = open({str(payload)!r}, "rb").read()
        print("ready", flush=True)
        while True:
            spool.write(data)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while len(list((tmp_path / "spool").glob("*.otlp"))) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    spool = Spool(tmp_path / "spool")  # the restart: stray temp files are swept
    assert not list((tmp_path / "spool").glob(f"*{TMP_SUFFIX}"))
    records = [data for _path, data in spool]
    assert len(records) >= 20
    for data in records:  # every record replays as the complete request
        assert data == requests[0]
        ExportTraceServiceRequest.FromString(data)


def test_opening_sweeps_only_temp_files_of_dead_writers(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    live_pid, dead_pid = os.getppid(), int(dead.stdout)  # our parent runs; the child has exited
    live = tmp_path / f"{time.time_ns():020d}-{live_pid:07d}-{0:09d}{TMP_SUFFIX}"
    stale = tmp_path / f"{time.time_ns():020d}-{dead_pid:07d}-{0:09d}{TMP_SUFFIX}"
    live.write_bytes(b"a write in progress in another process")
    stale.write_bytes(b"a write its crash interrupted")
    Spool(tmp_path)
    assert (live.exists(), stale.exists()) == (True, False)
