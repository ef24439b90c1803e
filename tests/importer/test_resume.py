"""An import interrupted by a real SIGINT records exactly what was delivered; ``--resume`` sends
the rest, so every span arrives exactly once over the two runs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from export.receivers import HttpReceiver, Reply, free_port, http_receiver, wait_until

from otelprof.cli.import_ import with_import_service
from otelprof.converter import convert
from otelprof.export.spool import Spool
from otelprof.importer import convert_source, find_sources
from otelprof.importer.ledger import digest
from otelprof.resource import options_from_env

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
    (source,) = find_sources([trace])
    want = convert_source(source, dataclasses.replace(options_from_env({}), run_id=source.run_id)).requests
    assert ids(decode(spooled)) == ids(decode(want)) and len(want) == 1
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


def _legacy_digest(requests: list[bytes]) -> str:
    """The ledger's digest before ``c1:``: sha256 over each request's length and bytes."""
    h = hashlib.sha256()
    for request in requests:
        h.update(len(request).to_bytes(8, "little"))
        h.update(request)
    return h.hexdigest()


def test_digest_tells_a_changed_request_and_keeps_reading_earlier_ledgers() -> None:
    requests = [b"a" * 5000, b"b" * 7000]
    d = digest(requests)
    assert d.startswith("c1:") and d == digest(list(requests))
    assert digest([requests[0], b"b" * 6999 + b"c"]) != d  # one byte of one request
    assert digest([requests[0], b"b" * 7001]) != d
    assert digest(requests[::-1]) != d
    assert digest(requests, like=_legacy_digest(requests)) == _legacy_digest(requests)
    assert digest(requests, like=d) == d


def test_resume_from_a_ledger_written_with_the_earlier_digest(tmp_path: Path) -> None:
    """A ledger from before ``c1:`` digests still resumes where it stopped: only the requests it
    did not record are sent (decoded by the receiver), and the entry ends complete."""
    trace = shared("sampled_rank-0")
    ledger = tmp_path / "ledger.json"
    flags: list[str | Path] = ["--ledger", ledger, "--max-request-bytes", "65536", "-q"]
    with http_receiver() as rec, import_env(tmp_path, rec.port):
        assert run_import(trace, *flags) == 0
        sent_first = list(rec.requests)
        assert len(sent_first) > 2
        doc = json.loads(ledger.read_text())
        (key,) = doc["files"]
        (source,) = find_sources([trace])
        options = with_import_service(options_from_env(os.environ, max_request_bytes=65536))  # as the CLI's
        requests = convert_source(source, dataclasses.replace(options, run_id=source.run_id, rank=source.rank)).requests
        assert doc["files"][key]["digest"] == digest(requests)
        doc["files"][key].update(digest=_legacy_digest(requests), sent=2)  # as an earlier version wrote it
        ledger.write_text(json.dumps(doc))
        with rec.lock:
            rec.requests.clear()
        assert run_import(trace, *flags, "--resume") == 0
        assert ids(received(rec.requests)) == ids(decode(requests[2:]))
    entry = json.loads(ledger.read_text())["files"][key]
    assert entry["sent"] == entry["requests"] == len(requests)
    assert entry["digest"] == _legacy_digest(requests)
