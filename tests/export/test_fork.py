"""Fork safety: a child forked while the parent exports gets a clean exporter; both deliver."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from converter_helpers import shared_trace

from otelprof.converter import convert
from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import Exporter

from .receivers import http_receiver


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_parent_and_forked_child_both_export(tmp_path: Path) -> None:
    requests = convert(shared_trace("critical_path"), detail="full", max_request_bytes=8 * 1024).requests
    parent_part, child_part = requests[: len(requests) // 2], requests[len(requests) // 2 :]
    with http_receiver() as rec:
        cfg = exporter_config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}"})
        exporter = Exporter(cfg, spool_dir=tmp_path)
        for r in parent_part:  # the worker is busy while we fork
            exporter.submit(r)
        pid = os.fork()
        if pid == 0:  # child: same exporter object, fresh worker and lock
            code = 1
            try:
                for r in child_part:
                    exporter.submit(r)
                code = 0 if exporter.flush(20) else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            pytest.fail("the forked child hung")
        assert os.waitstatus_to_exitcode(status) == 0
        assert exporter.flush(20)
        exporter.shutdown()
    received = sorted(r.SerializeToString() for r in rec.requests)
    assert received == sorted(requests)  # every request from both processes, once
