"""An out-of-memory error that ends a real CPU training process (oom_train.py, a bounded
address space): the failed step reaches the backend as an error ``train.step`` with the
exception event, ``otelprof_oom_total`` is pushed over OTLP, the user's traceback is printed as
without otelprof, and with no backend reachable the failed step is in the spool."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from export.receivers import http_receiver
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from otelprof.capture.memory import oom
from otelprof.export.spool import Spool

pytest.importorskip("torch")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FAIL_AT = 4
#: the training subprocesses' tests
subprocess_test = pytest.mark.slow
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")


def _run(tmp_path: Path, endpoint: str, bare: bool = False, mode: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_METRIC_EXPORT_INTERVAL="60000",  # only the export at the end
        OTELPROF_RUN_ID="oom",
        OTELPROF_PROFILE="false",
        OTELPROF_OOM_WAIT="3",
        OTELPROF_SPOOL_DIR=str(tmp_path / "spool"),
        OTELPROF_QUIET="true",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    args = [
        sys.executable,
        str(HERE / "oom_train.py"),
        str(FAIL_AT),
        *(["bare"] if bare else []),
        *([mode] if mode else []),
    ]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


def _traceback(stderr: str) -> str:
    return stderr[stderr.index("Traceback (most recent call last)") :]


def _steps(spans: list[Any]) -> dict[int, Any]:
    out = {}
    for span in spans:
        if span.name == "train.step":
            number = next(kv.value.int_value for kv in span.attributes if kv.key == "otelprof.step.number")
            assert number not in out
            out[number] = span
    return out


def _check_failed_step(steps: dict[int, Any]) -> None:
    assert sorted(steps) == list(range(FAIL_AT + 1))
    for n in range(FAIL_AT):
        assert steps[n].status.code == Status.STATUS_CODE_UNSET and not steps[n].events
    failed = steps[FAIL_AT]
    assert failed.status.code == Status.STATUS_CODE_ERROR
    assert "can't allocate memory" in failed.status.message
    assert failed.start_time_unix_nano >= steps[FAIL_AT - 1].end_time_unix_nano
    (event,) = failed.events
    assert event.name == "exception"
    attrs = {kv.key: kv.value for kv in event.attributes}
    assert attrs["exception.type"].string_value == "RuntimeError"
    assert "DefaultCPUAllocator: can't allocate memory" in attrs["exception.message"].string_value
    assert 'oom_train.py", line' in attrs["exception.stacktrace"].string_value
    assert attrs["otelprof.oom.device"].string_value == "cpu"
    assert attrs["otelprof.memory.resident_bytes"].int_value > 0
    peak = attrs["otelprof.memory.peak.resident_bytes"].int_value
    assert peak >= attrs["otelprof.memory.resident_bytes"].int_value
    span_attrs = {kv.key: kv.value for kv in failed.attributes}
    assert 0 < span_attrs["otelprof.memory.peak.resident_bytes"].int_value <= peak


@subprocess_test
@linux
def test_an_oom_that_ends_the_loop_reaches_the_backend(tmp_path: Path) -> None:
    with http_receiver() as rec:
        done = _run(tmp_path, f"http://127.0.0.1:{rec.port}")
        bare = _run(tmp_path, f"http://127.0.0.1:{rec.port}", bare=True)
    assert done.returncode == bare.returncode == 1
    assert _traceback(done.stderr) == _traceback(bare.stderr)  # the user's traceback, as without otelprof
    _check_failed_step(_steps(rec.spans))
    metrics = [
        m for r in rec.metric_requests for rm in r.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    ]
    ooms = [m for m in metrics if m.name == "otelprof.oom"]
    assert ooms, "otelprof.oom was never pushed"
    (point,) = ooms[-1].sum.data_points
    assert point.as_double == 1
    assert {kv.key: kv.value.string_value for kv in point.attributes}["device"] == "cpu"
    (peak,) = (m for m in metrics if m.name == "otelprof.step.memory.peak")
    kinds = {kv.value.string_value for p in peak.gauge.data_points for kv in p.attributes if kv.key == "kind"}
    assert kinds == {"resident"}


@subprocess_test
@linux
def test_an_oom_after_the_update_leaves_one_span_for_its_step(tmp_path: Path) -> None:
    """DataLoader mode: the step that ran out of memory after its update (before the next
    fetch, its boundary) is the error span only; the session's close does not end it again."""
    with http_receiver() as rec:
        done = _run(tmp_path, f"http://127.0.0.1:{rec.port}", mode="gap")
    assert done.returncode == 1 and "can't allocate memory" in done.stderr
    _check_failed_step(_steps(rec.spans))  # _steps: one span per step number


@subprocess_test
@linux
def test_with_no_backend_the_failed_step_is_spooled(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _run(tmp_path, f"http://127.0.0.1:{port}")
    assert done.returncode == 1 and "can't allocate memory" in done.stderr
    spans: list[Any] = []
    for _path, data in Spool(tmp_path / "spool"):
        try:
            request = ExportTraceServiceRequest.FromString(data)
        except Exception:
            continue  # not a traces request
        spans.extend(s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
    _check_failed_step(_steps(spans))


@pytest.mark.parametrize(
    ("exc", "device"),
    [
        (MemoryError(), "cpu"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"), "cpu"),
        (RuntimeError("shape mismatch"), None),
        (ValueError("can't allocate memory"), None),
    ],
)
def test_which_errors_are_out_of_memory(exc: BaseException, device: str | None) -> None:
    assert oom.oom_device(exc) == device


def test_the_hooks_chain_to_the_previous_ones() -> None:
    """A thread's OOM reaches otelprof's handler, then the hook that was there before; other
    errors only the latter; after uninstall the previous hooks are back."""
    import threading

    seen: list[tuple[str, str, bool]] = []
    chained: list[str] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: chained.append(type(args.exc_value).__name__)
    try:
        hooks = oom.OomHooks(lambda exc, device, main: seen.append((type(exc).__name__, device, main)))

        def fail(exc: BaseException) -> None:
            raise exc

        for exc in (MemoryError(), KeyError("x")):
            t = threading.Thread(target=fail, args=(exc,))
            t.start()
            t.join()
        assert seen == [("MemoryError", "cpu", False)]
        assert chained == ["MemoryError", "KeyError"]
        hooks.uninstall()
        assert threading.excepthook is not hooks._thread_hook
        assert sys.excepthook is hooks._sys_previous
    finally:
        threading.excepthook = previous


def test_the_failed_step_request_has_error_status_and_the_event() -> None:
    from otelprof.otlp.spans import Span

    span = Span(0, b"t" * 16, b"s" * 8, b"", "train.step", 10, 20, [("otelprof.step.number", 3)])
    child = Span(1, b"t" * 16, b"c" * 8, b"s" * 8, "forward", 11, 12, [])
    event = [*oom.exception_attrs(MemoryError("no room")), ("otelprof.oom.device", "cpu")]
    [raw] = oom.error_requests(
        [span, child], [("service.name", "x")], "1.0", 1 << 20, "MemoryError: no room", 15, event
    )
    first, second = ExportTraceServiceRequest.FromString(raw).resource_spans[0].scope_spans[0].spans
    assert first.status.code == Status.STATUS_CODE_ERROR and first.status.message == "MemoryError: no room"
    (ev,) = first.events
    assert (ev.name, ev.time_unix_nano) == ("exception", 15)
    attrs = {kv.key: kv.value.string_value for kv in ev.attributes}
    assert attrs["exception.type"] == "MemoryError" and attrs["exception.message"] == "no room"
    assert attrs["otelprof.oom.device"] == "cpu"
    assert second.status.code == Status.STATUS_CODE_UNSET and not second.events


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_an_abandoned_step_is_closed_by_nothing(native: bool) -> None:
    """The tracker twins drop the step an out-of-memory span took (after its update, before
    the fetch that would end it) and number the next one after it."""
    from otelprof.capture.steps.native_tracker import step_tracker

    closed: list[Any] = []
    tracker: Any = step_tracker(closed.append, native=native)

    def batch() -> None:
        tracker.begin_data()
        tracker.data_end(8, None)
        tracker.begin_forward(None, ())
        tracker.end_forward(None, (), None)
        tracker.begin_optimizer(None, (), {})
        tracker.end_optimizer(None, (), {})

    batch()
    batch()  # step 0 ended at this fetch; step 1 is open after its update
    assert tracker.abandon() == 1
    batch()  # a step that begins after it
    tracker.finish()
    assert [(s.number, s.samples) for s in closed] == [(0, 8), (2, 8)]
