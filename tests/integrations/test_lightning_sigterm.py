"""Lightning's own SIGTERM handling (its SignalConnector composes the handler it finds, then
stops the fit) is the same with otelprof as without, and every step Lightning completed is
delivered or spooled: a real fit, a real signal, the spool read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
from capture.test_preemption import _env, _spooled, _step_numbers, _updates
from export.receivers import free_port, wait_until

pytestmark = pytest.mark.slow  # training subprocesses, signalled
SCRIPT = str(Path(__file__).resolve().parent / "lightning_sigterm_train.py")


def _fit_and_terminate(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], int]:
    tmp_path.mkdir()
    truth = tmp_path / "global_step"
    env = _env(f"http://127.0.0.1:{free_port()}", tmp_path)  # a backend that is down: all spooled
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, str(truth), *flags], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(lambda: _updates(truth) >= 20 or proc.poll() is not None, 120)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), _updates(truth)


def test_lightning_stops_on_sigterm_as_without_otelprof(tmp_path: Path) -> None:
    bare, _ = _fit_and_terminate(tmp_path / "bare")
    instrumented, steps = _fit_and_terminate(tmp_path / "with", "--auto")
    assert "Received SIGTERM" in bare.stderr and "Received SIGTERM" in instrumented.stderr
    assert instrumented.returncode == bare.returncode, (bare.stderr[-2000:], instrumented.stderr[-2000:])
    assert ("fit returned" in instrumented.stdout) == ("fit returned" in bare.stdout)
    assert "Traceback" not in instrumented.stderr, instrumented.stderr
    numbers = _step_numbers(_spooled(tmp_path / "with"))
    assert numbers == list(range(len(numbers))) and len(numbers) in (steps, steps + 1), (numbers, steps)
    assert os.listdir(tmp_path / "with" / "spool")
