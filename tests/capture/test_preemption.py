"""The end of a run: SIGTERM, as Kubernetes and Slurm preempt, and a plain exit against a backend
that drips its replies. A real training process, a real signal, a real receiver (or none), the
spool read back: every step the loop completed is delivered or spooled, once, and the process
ends as it would have without otelprof (preemption.py), within the documented deadline."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from export.receivers import SlowHttpReceiver, free_port, http_receiver, slow_http_receiver, wait_until
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otelprof.export.spool import Spool

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # training subprocesses, signalled

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LOOP = str(HERE / "preempt_loop.py")
SIGNAL_AFTER = 25  # updates


def _env(endpoint: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTELPROF_RUN_ID": "preempt",
        "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
        "OTELPROF_PROFILE": "false",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **extra,
    }


def _updates(truth: Path) -> int:
    try:
        return int(truth.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _preempt(command: list[str], env: dict[str, str], truth: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Starts the loop, sends SIGTERM after SIGNAL_AFTER updates; the finished process and the
    seconds from the signal to its end."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _updates(truth) >= SIGNAL_AFTER or proc.poll() is not None, 90)
        assert proc.poll() is None, proc.communicate()
        Path(str(truth) + ".signalled").touch()
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in err, err
    return subprocess.CompletedProcess(command, proc.returncode, out, err), took


def _spooled(tmp_path: Path) -> list[Span]:
    folder = tmp_path / "spool"
    if not folder.exists():
        return []
    spans = []
    for _record, data in Spool(folder):
        request = ExportTraceServiceRequest.FromString(data)
        spans += [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    return spans


def _step_numbers(spans: list[Span]) -> list[int]:
    steps = [s for s in spans if s.name == "train.step"]
    return sorted(next(kv.value.int_value for kv in s.attributes if kv.key == "otelprof.step.number") for s in steps)


def _assert_every_closed_step(spans: list[Span], truth: Path) -> None:
    """Steps 0..n-1, each once, where n is what the loop completed (a SIGTERM between the update
    and the loop's own write of its count leaves the loop's count one behind)."""
    numbers = _step_numbers(spans)
    updates = _updates(truth)
    assert numbers == list(range(len(numbers))), numbers
    assert len(numbers) in (updates, updates + 1), (len(numbers), updates)


def _run(*script: str) -> list[str]:
    return [sys.executable, "-m", "otelprof", "run", "--", sys.executable, LOOP, *script]


@contextmanager
def _black_hole() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("backend", ["receiver", "down"])
def test_sigterm_mid_run_delivers_or_spools_every_step_and_exits_143(tmp_path: Path, backend: str) -> None:
    """`otelprof run` keeps the handler for the command it execs; the process dies of SIGTERM."""
    truth = tmp_path / "updates"
    with http_receiver() as rec:
        port = rec.port if backend == "receiver" else free_port()
        out, took = _preempt(_run(str(truth), "default"), _env(f"http://127.0.0.1:{port}", tmp_path), truth)
        received = list(rec.spans)
    assert out.returncode == -signal.SIGTERM, out.stderr  # 143 in a shell
    assert "SIGTERM" in out.stderr
    assert took < 10 + 5  # the default grace, and a generous margin for a loaded machine
    spooled = _spooled(tmp_path)
    if backend == "down":
        assert not received
    _assert_every_closed_step(received + spooled, truth)


def test_sigterm_mid_window_keeps_the_steps_and_the_windows_operators(tmp_path: Path) -> None:
    truth = tmp_path / "updates"
    profile = {
        "OTELPROF_PROFILE": "true",
        "OTELPROF_PROFILE_SKIP_FIRST": "5",
        "OTELPROF_PROFILE_WAIT": "0",
        "OTELPROF_PROFILE_WARMUP": "1",
        "OTELPROF_PROFILE_ACTIVE": "500",  # still recording when the signal comes
    }
    with http_receiver() as rec:
        env = _env(f"http://127.0.0.1:{rec.port}", tmp_path, **profile)
        out, _took = _preempt(_run(str(truth), "default"), env, truth)
        received = list(rec.spans)
    assert out.returncode == -signal.SIGTERM, out.stderr
    spans = received + _spooled(tmp_path)
    _assert_every_closed_step(spans, truth)
    windowed = [
        s
        for s in spans
        if s.name == "train.step"
        and any(kv.key == "otelprof.step.window" and kv.value.string_value == "recorded" for kv in s.attributes)
    ]
    operators = [s for s in spans if s.name.startswith("aten::")]
    assert len(windowed) >= SIGNAL_AFTER - 6, len(windowed)  # steps 6.. were recorded
    assert operators, sorted({s.name for s in spans})[:20]


@pytest.mark.parametrize("handler", ["flag", "late-compose"])
def test_the_programs_own_handler_decides(tmp_path: Path, handler: str) -> None:
    """A handler installed before otelprof is called; one installed after that calls the one it
    replaced (Lightning's way) calls otelprof's, which then does not end the process."""
    truth = tmp_path / "updates"
    with http_receiver() as rec:
        command = [sys.executable, LOOP, str(truth), handler, "--auto"]
        out, _took = _preempt(command, _env(f"http://127.0.0.1:{rec.port}", tmp_path), truth)
        received = list(rec.spans)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("stopping"), out.stdout
    numbers = _step_numbers(received + _spooled(tmp_path))
    assert numbers == list(range(_updates(truth)))


def test_an_ignored_sigterm_stays_ignored(tmp_path: Path) -> None:
    truth = tmp_path / "updates"
    with http_receiver() as rec:
        out, _took = _preempt(_run(str(truth), "ignore"), _env(f"http://127.0.0.1:{rec.port}", tmp_path), truth)
        received = list(rec.spans)
    assert out.returncode == 0, out.stderr
    assert _updates(truth) >= SIGNAL_AFTER + 39  # trained on: 40 more iterations, counting the one it saw the signal in
    assert _step_numbers(received + _spooled(tmp_path)) == list(range(_updates(truth)))


def test_a_backend_that_never_answers_cannot_hold_the_process_past_the_grace(tmp_path: Path) -> None:
    truth = tmp_path / "updates"
    with _black_hole() as port:
        env = _env(f"http://127.0.0.1:{port}", tmp_path, OTELPROF_SIGTERM_GRACE="3", OTEL_EXPORTER_OTLP_TIMEOUT="60000")
        out, took = _preempt(_run(str(truth), "default"), env, truth)
    assert out.returncode == -signal.SIGTERM, out.stderr
    assert took < 3 + 6, took  # the grace, the last spool second, and a loaded machine's margin
    _assert_every_closed_step(_spooled(tmp_path), truth)


def test_uninstrument_puts_the_previous_handler_back(tmp_path: Path) -> None:
    """In process: instrument() installs otelprof's handler over the default, uninstrument()
    puts the default back; a handler the program installed meanwhile is left in place."""
    code = (
        "import signal, otelprof\n"
        "otelprof.instrument()\n"
        "h = signal.getsignal(signal.SIGTERM)\n"
        "assert h not in (signal.SIG_DFL, None), h\n"
        "otelprof.uninstrument()\n"
        "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
        "otelprof.instrument()\n"
        "mine = lambda s, f: None\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        "otelprof.uninstrument()\n"
        "assert signal.getsignal(signal.SIGTERM) is mine\n"
        "print('ok')\n"
    )
    env = _env(f"http://127.0.0.1:{free_port()}", tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


def test_a_dripping_receiver_at_exit_loses_nothing_and_keeps_the_exit_deadline(tmp_path: Path) -> None:
    """One byte of reply every 2 s (each read's timeout restarted with each byte before): the exit
    takes about the documented 5 s and every step is delivered or spooled."""
    steps = 30
    with slow_http_receiver(SlowHttpReceiver(drip_s=2.0)) as rec:
        env = _env(f"http://127.0.0.1:{rec.port}", tmp_path)
        command = [sys.executable, str(HERE / "train_loop.py"), str(steps), "0", "--auto"]
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the loop's last line: what follows is otelprof's exit
        trained = time.monotonic()
        _out, err = proc.communicate(timeout=60)
        took = time.monotonic() - trained
        received = [s for r in rec.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert line == f"trained {steps}\n" and proc.returncode == 0, err
    assert took < 5 + 4, took  # the exit deadline, and a loaded machine's margin
    numbers = _step_numbers(received + _spooled(tmp_path))
    assert sorted(set(numbers)) == list(range(steps)), numbers  # an interrupted request may come twice
