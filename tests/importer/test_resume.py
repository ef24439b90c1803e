"""An import interrupted by a real SIGINT records exactly what was delivered; ``--resume`` sends
the rest, so every span arrives exactly once over the two runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from export.receivers import HttpReceiver, Reply, free_port, http_receiver, wait_until

from otelprof.converter import convert
from otelprof.export.spool import Spool
from otelprof.importer import find_sources

from .helpers import SHARED, decode, ids, import_env, received, run_import, shared

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")


def _spawn(env: dict[str, str], *args: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "otelprof", "import", *map(str, args)],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigint_then_resume_sends_every_span_exactly_once(tmp_path: Path) -> None:
    files = [shared("sampled_rank-0"), shared("sampled_rank-1"), shared("alexnet")]
    ledger = tmp_path / "ledger.json"
    flags = ["--max-request-bytes", "8192", "--batch-bytes", "32768", "--ledger", str(ledger)]
    slow = HttpReceiver(script=[Reply(delay_s=0.05) for _ in range(1000)])  # a slow backend
    with http_receiver(slow) as rec, import_env(tmp_path, rec.port) as env:
        proc = _spawn(env, *files, *flags)
        wait_until(lambda: len(rec.requests) >= 12)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "SIGINT: stopping after the requests in flight" in err
        assert "--resume" in err
        first = len(rec.requests)
        # the ledger holds exactly what arrived: nothing claimed that was not delivered
        entries = json.loads(ledger.read_text())["files"]
        assert sum(e["sent"] for e in entries.values()) == first
        total = sum(e["requests"] for e in entries.values())
        assert 0 < first < total or len(entries) < len(files)

        with rec.lock:
            rec.script.clear()
        resumed = _spawn(env, *files, *flags, "--resume")
        _out, err = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, err
        assert "imported 3 of 3 files" in err

        again = _spawn(env, *files, *flags, "--resume")  # everything is in the ledger already
        _out, err = again.communicate(timeout=120)
        assert again.returncode == 0 and "3 already imported (ledger)" in err, err
        got = ids(received(rec.requests))
    assert Spool(tmp_path / "spool").records() == []
    counts = Counter(got)
    assert max(counts.values()) == 1, "a span was sent twice"
    want = []
    run_ids = {s.path: s.run_id for s in find_sources(files)}
    assert run_ids[files[0]] == run_ids[files[1]] != run_ids[files[2]]  # the two ranks are one run
    for path in files:
        want += ids(decode(convert(path, run_id=run_ids[path], max_request_bytes=8192).requests))
    assert set(counts) == set(want) and len(want) == len(got)


def test_a_changed_file_starts_over_on_resume(tmp_path: Path) -> None:
    trace = tmp_path / "t.json.gz"
    trace.write_bytes(shared("amd_trace").read_bytes())
    ledger = tmp_path / "ledger.json"
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        assert run_import(trace, "--ledger", ledger, "-q") == 0
        first = len(rec.requests)
        assert run_import(trace, "--ledger", ledger, "--resume", "-q") == 0
        assert len(rec.requests) == first  # nothing left to send
        trace.write_bytes(shared("cpu_only").read_bytes())  # same name, other content
        assert run_import(trace, "--ledger", ledger, "--resume", "-q") == 0
        assert len(rec.requests) > first


def test_without_endpoint_everything_goes_to_the_spool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = shared("saxpy", SHARED / "nsys")
    with import_env(tmp_path, None):
        assert run_import(trace) == 0
    err = capsys.readouterr().err
    assert "spooled to" in err and "no OTLP endpoint configured" in err
    spooled = [data for _record, data in Spool(tmp_path / "spool")]
    assert len(decode(spooled)) == 100
    # the default ledger lives under ~/.cache/otelprof/imports
    assert len(list((tmp_path / "home" / ".cache" / "otelprof" / "imports").glob("*.json"))) == 1


def test_unreachable_endpoint_spools_and_the_ledger_counts_it_delivered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = shared("amd_trace")
    ledger = tmp_path / "ledger.json"
    with import_env(tmp_path, free_port()):
        assert run_import(trace, "--ledger", ledger) == 0
    err = capsys.readouterr().err
    assert "1 requests spooled to" in err and "no OTLP endpoint" not in err
    spooled = [data for _record, data in Spool(tmp_path / "spool")]
    (source,) = find_sources([trace])
    assert ids(decode(spooled)) == ids(decode(convert(trace, run_id=source.run_id).requests))
    (entry,) = json.loads(ledger.read_text())["files"].values()
    assert entry["sent"] == entry["requests"] == 1
