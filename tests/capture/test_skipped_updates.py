"""Skipped updates end to end on both routes: the native tracker folding into the native sink
and encoder, and the Python tracker, StepMetrics and the reference encoder, fed the same
activity, mark the same steps ``otelprof.step.skipped`` and count them in
``otelprof_skipped_updates_total`` (exposed from the first skipped update on)."""

from __future__ import annotations

from typing import Any

from converter_helpers import native_module
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .test_step_sink import _event, _native_path, _python_path

native_module()


def _loop(skips: list[bool]) -> list[tuple[str, Any]]:
    """A DataLoader loop whose GradScaler.step (the hooks' begin_optimizer ... end_update) calls
    the optimizer's own step (its hooks, inside) unless the update is skipped."""
    events: list[tuple[str, Any]] = []
    for skip in skips:
        events += [("begin", "data"), ("tick", 10), ("data_end", (4, 32)), ("begin_forward", 0), ("tick", 20)]
        events += [("end", "forward"), ("begin", "backward"), ("tick", 20), ("end", "backward")]
        events += [("begin_optimizer", 0), ("tick", 3)]
        if not skip:
            events += [("begin_optimizer", 0), ("tick", 10), ("end", "optimizer")]
        events += [("end", "update"), ("tick", 5)]
    return [*events, ("begin", "data"), ("end_data", None)]


def _skipped(requests: list[bytes]) -> list[bool]:
    spans = [
        span
        for data in requests
        for rs in ExportTraceServiceRequest.FromString(data).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if span.name == "train.step"
    ]
    steps = sorted(spans, key=lambda s: s.start_time_unix_nano)
    return [any(kv.key == "otelprof.step.skipped" and kv.value.bool_value for kv in s.attributes) for s in steps]


def test_skipped_updates_are_marked_and_counted_alike_on_both_routes() -> None:
    skips = [False, True, False, True, True]
    native_side = _native_path(_loop(skips), 1 << 20)
    assert native_side == _python_path(_loop(skips), 1 << 20)
    lines, requests, _boundaries = native_side
    assert _skipped(requests) == skips
    assert [line.rsplit(" ", 1)[1] for line in lines if line.startswith("otelprof_skipped_updates_total")] == ["3.0"]
    assert [line.rsplit(" ", 1)[1] for line in lines if line.startswith("otelprof_steps_total")] == ["5.0"]
    unskipped, _requests, _b = _native_path(_loop([False, False]), 1 << 20)
    assert not [line for line in unskipped if "skipped" in line]  # no series before the first skip


@settings(max_examples=150, deadline=None)
@given(st.lists(_event() | st.just(("end", "update")), max_size=150), st.sampled_from([900, 3 * 1024 * 1024]))
def test_native_steps_with_scaler_updates_equal_the_python_path(events: list[tuple[str, Any]], max_bytes: int) -> None:
    assert _native_path(events, max_bytes) == _python_path(events, max_bytes)
