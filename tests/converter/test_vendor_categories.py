"""Accelerators other than CUDA: MTIA, XPU and PrivateUse1 categories nest like CUDA ones."""

from __future__ import annotations

import json

import pytest
from converter_helpers import decode

from otelprof.converter import convert


def _trace(runtime_cat: str, device_cat: str) -> bytes:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 100, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 110, "dur": 50,
         "args": {"External id": 3}},
        {"ph": "X", "cat": runtime_cat, "name": "launch", "pid": 1, "tid": 1, "ts": 120, "dur": 20,
         "args": {"correlation": 42, "External id": 3}},
        {"ph": "X", "cat": device_cat, "name": "mm_fwd", "pid": 0, "tid": 3, "ts": 150, "dur": 30,
         "args": {"correlation": 42, "device": 0, "stream": 3}},
    ]  # fmt: skip
    return json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}).encode()


@pytest.mark.parametrize(
    ("runtime_cat", "device_cat"),
    [("mtia_runtime", "mtia_ccp_events"), ("xpu_runtime", "kernel"), ("privateuse1_runtime", "kernel")],
)
def test_device_work_hangs_under_its_launch(engine: str, runtime_cat: str, device_cat: str) -> None:
    result = convert(_trace(runtime_cat, device_cat), engine=engine, detail="full")
    spans = {s.name: s for s in decode(result).spans}
    kernel, launch, op, step = spans["mm_fwd"], spans["launch"], spans["aten::mm"], spans["ProfilerStep#7"]
    assert kernel.parent_id == launch.span_id
    assert launch.parent_id == op.span_id
    assert op.parent_id == step.span_id
    assert kernel.attrs["otelprof.gpu.stream"] == 3
    assert kernel.start == 1_700_000_000_000_150_000
    # the kernel's time is the launching op's self device time (the runtime call's is zero)
    assert op.attrs["otelprof.op.self_device_time_ns"] == 30_000
    assert launch.attrs["otelprof.op.self_device_time_ns"] == 0
    (row,) = [r for r in result.ops if r.name == "aten::mm"]
    assert (row.self_device_ns, row.device_total_ns) == (30_000, 30_000)
    (step_row,) = [r for r in result.ops if r.name == "ProfilerStep*"]
    assert (step_row.self_device_ns, step_row.device_total_ns) == (0, 30_000)
