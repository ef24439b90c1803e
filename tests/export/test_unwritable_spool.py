"""A spool that cannot be written loses data only counted and logged once (issue 14, item 3).

The tests run as root, and root ignores permission bits, so ``chmod`` cannot make a folder
unwritable. Two real failures that hold for root instead:

- a spool folder *under a regular file*: it can never be created (``NotADirectoryError``);
- a *read-only mount* (``EROFS``) and a *full tmpfs* (``ENOSPC``), made in a child process with
  its own mount namespace (``unshare --mount``: a read-only bind mount of a temporary folder,
  a 64 KiB tmpfs), so nothing outside the child sees them. Where the machine refuses a mount
  namespace, those tests are skipped (saying so).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest
from converter_helpers import shared_trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from otelprof.converter import convert
from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import Exporter
from otelprof.export.spool import Spool
from otelprof.importer import find_sources

from .receivers import free_port, http_receiver, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_mount_namespace = pytest.mark.skipif(
    not _can_unshare(), reason="no mount namespace here (unshare --mount refused): cannot make a read-only mount"
)


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    return convert(shared_trace("critical_path"), detail="full", max_request_bytes=8 * 1024).requests[:10]


def _exporter(port: int, spool_dir: Path, registry: CollectorRegistry) -> Exporter:
    config = exporter_config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
    return Exporter(
        config, spool_dir=spool_dir, backoff_s=0.01, max_backoff_s=0.05, probe_interval_s=0.05, registry=registry
    )


def _span_ids(requests: Iterable[ExportTraceServiceRequest]) -> list[tuple[bytes, bytes, str]]:
    return [
        (s.trace_id, s.span_id, s.name)
        for r in requests
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]


def _dropped(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value("otelprof_export_dropped_requests_total", {"signal": "traces", "reason": reason})


def test_a_spool_folder_that_cannot_be_created_still_exports(tmp_path: Path, requests: list[bytes]) -> None:
    """Before: ``Exporter()`` raised, and the instrumentation was off altogether."""
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    registry = CollectorRegistry()
    with http_receiver() as rec:
        exporter = _exporter(rec.port, blocker / "spool", registry)
        for r in requests:
            exporter.submit(r)
        assert exporter.flush(30)
        exporter.shutdown()
    assert [r.SerializeToString() for r in rec.requests] == requests
    assert registry.get_sample_value(
        "otelprof_export_requests_total", {"signal": "traces", "result": "exported"}
    ) == len(requests)
    assert registry.get_sample_value("otelprof_export_spool_bytes", {"signal": "traces"}) == 0


def test_a_spool_folder_that_cannot_be_created_counts_every_loss_and_logs_once(
    tmp_path: Path, requests: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    registry = CollectorRegistry()
    with caplog.at_level(logging.WARNING):
        exporter = _exporter(free_port(), blocker / "spool", registry)  # nothing listens: must spool
        for r in requests:
            exporter.submit(r)
        assert exporter.flush(30)
        exporter.shutdown()
    assert exporter.counters.requests_dropped == len(requests)
    assert exporter.counters.dropped_by_reason == {"spool_unwritable": len(requests)}
    assert _dropped(registry, "spool_unwritable") == len(requests)
    assert registry.get_sample_value(
        "otelprof_export_requests_total", {"signal": "traces", "result": "dropped"}
    ) == len(requests)
    assert (
        registry.get_sample_value("otelprof_export_worker_errors_total", {"signal": "traces"}) == 0
    )  # handled, not caught
    warnings = [r.getMessage() for r in caplog.records if "spool" in r.getMessage()]
    assert len(warnings) == 1 and "Not a directory" in warnings[0], warnings
    assert Spool(blocker / "spool").write(b"x") is False  # and never raises


_CHILD = """
import json, logging, sys
from prometheus_client import CollectorRegistry
from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import Exporter
logging.basicConfig(level=logging.WARNING)
spool_dir, port, payloads = sys.argv[1], int(sys.argv[2]), json.loads(sys.stdin.read())
registry = CollectorRegistry()
cfg = exporter_config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
exporter = Exporter(cfg, spool_dir=spool_dir, backoff_s=0.01, max_backoff_s=0.05, registry=registry)
for p in payloads:
    exporter.submit(bytes.fromhex(p))
flushed = exporter.flush(30)
exporter.shutdown()
c = exporter.counters
print(json.dumps({
    "flushed": flushed, "spooled": c.requests_spooled, "dropped": c.requests_dropped,
    "by_reason": c.dropped_by_reason, "records": len(exporter.spool.records()),
    "metric": registry.get_sample_value(
        "otelprof_export_dropped_requests_total", {"signal": "traces", "reason": "spool_unwritable"}
    ),
    "worker_errors": registry.get_sample_value("otelprof_export_worker_errors_total", {"signal": "traces"}),
}))
"""


def _in_mount_namespace(setup: str, folder: Path, argv: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` in a mount namespace of its own where ``setup`` (sh, ``$0`` = folder) ran first."""
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", f'{setup} && exec "$@"', str(folder), *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0"'
# mode=0700: a tmpfs root is 1777 by default, which the spool refuses as unsafe (others can write)
TINY_TMPFS = 'mount -t tmpfs -o size=64k,mode=0700 otelprof-test "$0"'


@needs_mount_namespace
@pytest.mark.parametrize(("setup", "error"), [(READ_ONLY, "Read-only file system"), (TINY_TMPFS, "No space left")])
def test_a_read_only_or_full_spool_counts_every_loss_and_logs_once(
    setup: str, error: str, tmp_path: Path, requests: list[bytes]
) -> None:
    """Before: the write's error path raised again (unlinking the temp file on a read-only
    mount), nothing was counted, and the worker only logged "export worker error"."""
    spool = tmp_path / "spool"
    spool.mkdir()
    payloads = json.dumps([r.hex() for r in requests])
    out = _in_mount_namespace(setup, spool, [sys.executable, "-c", _CHILD, str(spool), str(free_port())], payloads)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    n = len(requests)
    assert got["flushed"] and got["worker_errors"] == 0
    assert got["spooled"] + got["dropped"] == n and got["dropped"] >= 1
    assert got["records"] == got["spooled"]  # what was counted spooled is on disk
    assert got["by_reason"] == {"spool_unwritable": got["dropped"]} and got["metric"] == got["dropped"]
    if setup == READ_ONLY:
        assert got["spooled"] == 0
    assert out.stderr.count("spool write failed") == 1 and error in out.stderr, out.stderr  # logged once


@needs_mount_namespace
def test_import_to_a_read_only_spool_fails_and_resume_sends_what_was_lost(tmp_path: Path) -> None:
    """Before: "1 requests spooled", exit 0, and the ledger recorded the batch, so --resume
    skipped it: its spans were never sent anywhere."""
    trace = shared_trace("amd_trace")
    spool, ledger, home = tmp_path / "spool", tmp_path / "ledger.json", tmp_path / "home"
    spool.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "OTELPROF_SPOOL_DIR": str(spool), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "otelprof", "import", str(trace), "--ledger", str(ledger)]
    unreachable = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    out = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f'{READ_ONLY} && exec "$@"', str(spool), *command],
        env=unreachable,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 1, out.stderr
    assert "requests spooled" not in out.stderr and "imported 0 of 1 files" in out.stderr, out.stderr
    assert "1 requests were lost (1 spool_unwritable" in out.stderr, out.stderr
    assert "spool write failed" in out.stderr and "Read-only file system" in out.stderr
    assert not ledger.exists() or all(e["sent"] == 0 for e in json.loads(ledger.read_text())["files"].values())

    with http_receiver() as rec:  # the backend is back: --resume sends what the first run lost
        resumed = subprocess.run(
            [*command, "--resume"],
            env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}"},
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert resumed.returncode == 0, resumed.stderr
        wait_until(lambda: len(rec.requests) == 1)
    (source,) = find_sources([trace])  # the run id the import gave it
    want = convert(trace, run_id=source.run_id).requests
    assert _span_ids(rec.requests) == _span_ids(ExportTraceServiceRequest.FromString(r) for r in want)
    (entry,) = json.loads(ledger.read_text())["files"].values()
    assert entry["sent"] == entry["requests"] == 1


def test_a_training_job_with_an_uncreatable_spool_still_sends_step_spans_and_serves_metrics(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    """Before: the session's ``Exporter()`` raised at the first step, so otelprof was off
    altogether (no /metrics, no step spans) although the endpoint was reachable."""
    torch = pytest.importorskip("torch")
    import otelprof

    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    with http_receiver() as rec:
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}",
            "OTELPROF_SPOOL_DIR": str(blocker / "spool"),
            "OTELPROF_PROFILE": "false",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        }
        registry = CollectorRegistry()
        session = otelprof.instrument(environ=environ, registry=registry)
        assert session is not None
        try:
            model = torch.nn.Linear(8, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(4):
                model(torch.randn(4, 8)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
            assert session.metrics_port is not None
            with urllib.request.urlopen(f"http://127.0.0.1:{session.metrics_port}/metrics", timeout=10) as page:
                scrape = page.read().decode()
        finally:
            otelprof.uninstrument()
        assert session.exporter is not None and session.exporter.flush(30)
        session.exporter.shutdown()
        steps = [s for s in _span_ids(rec.requests) if s[2] == "train.step"]
    assert len(steps) == 4
    assert "otelprof_export_requests_total" in scrape and "otelprof_export_dropped_requests_total" in scrape
    assert "otelprof_steps_total" in scrape  # the step metrics run too
