"""``otelprof import`` against slow backends (issue 14, item 8).

A backend that stores a request before it answers (MLflow) can take longer than the exporter's
timeout on a large request: the request is then sent again although the backend stored it.
Over OTLP/HTTP the import makes smaller requests (1 MiB), and it waits longer (30 s) unless
``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`` says otherwise. A request that still times out is sent
twice with the same trace and span ids: a backend that deduplicates by id stores it once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from export.receivers import HttpReceiver, Reply, grpc_receiver, http_receiver

from otelprof.cli.import_ import HTTP_IMPORT_REQUEST_BYTES, IMPORT_TIMEOUT_S, import_exporter_config
from otelprof.converter import convert

from .helpers import SHARED, decode, ids, import_env, received, run_id_of, run_import, shared

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")


def test_import_waits_longer_than_the_live_exporter_unless_told() -> None:
    assert import_exporter_config({}).timeout_s == IMPORT_TIMEOUT_S == 30.0
    assert import_exporter_config({"OTEL_EXPORTER_OTLP_TIMEOUT": "2000"}).timeout_s == 2.0
    both = {"OTEL_EXPORTER_OTLP_TIMEOUT": "2000", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "45000"}
    assert import_exporter_config(both).timeout_s == 45.0


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_import_over_http_sends_smaller_requests(protocol: str, tmp_path: Path) -> None:
    """The same spans either way; over HTTP in requests of at most 1 MiB (3 MiB over gRPC, where
    the receiver's limit is 4 MiB and the Collector answers before storing)."""
    trace = shared("nccl_data")
    ledger = tmp_path / "ledger.json"
    receiver = grpc_receiver() if protocol == "grpc" else http_receiver()
    with import_env(tmp_path, None), pytest.MonkeyPatch.context() as mp, receiver as rec:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{rec.port}")
        mp.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        assert run_import(trace, "--detail", "full", "--ledger", ledger, "-q") == 0
        sizes = [r.ByteSize() for r in rec.requests]
        got = received(rec.requests)
    limit = HTTP_IMPORT_REQUEST_BYTES if protocol == "http/protobuf" else 3 * 1024 * 1024
    assert max(sizes) <= limit < sum(sizes)
    assert len(sizes) > 1
    if protocol == "http/protobuf":
        assert max(sizes) <= 1024 * 1024 and len(sizes) > 3  # the 3 MiB default made 3
    want = decode(convert(trace, run_id=run_id_of(trace), detail="full").requests)
    assert ids(got) == ids(want)
    assert [g.span.name for g in got] == [g.span.name for g in want]


def test_a_request_that_times_out_after_the_backend_stored_it_arrives_twice_with_the_same_ids(
    tmp_path: Path,
) -> None:
    """A real slow receiver: it keeps the request, then answers after the client gave up (1 s
    timeout, 2 s answer). The exporter sends it again; the receiver holds it twice, span for
    span the same ids, so a backend that deduplicates by id stores it once; the import
    succeeds and its ledger records the file."""
    trace = shared("amd_trace")
    ledger = tmp_path / "ledger.json"
    slow = HttpReceiver(script=[Reply(delay_s=2.0)])
    with http_receiver(slow) as rec, import_env(tmp_path, rec.port), pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")
        assert run_import(trace, "--ledger", ledger, "-q") == 0
        got = received(rec.requests)
        assert len(rec.requests) == 2 and rec.requests[0] == rec.requests[1]
    want = ids(decode(convert(trace, run_id=run_id_of(trace)).requests))
    assert ids(got) == want + want  # sent twice ...
    assert sorted(set(ids(got))) == sorted(want)  # ... one span each once deduplicated by id
    (entry,) = json.loads(ledger.read_text())["files"].values()
    assert entry["sent"] == entry["requests"] == 1
