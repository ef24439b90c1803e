"""The native reader digests each event's args as it reads them (span attributes, the ids the
event tree and links match on, memory integers) and copies every string it keeps, so that
neither the document nor the JSON text outlives the read. These traces put the awkward cases
of that digest (escaped text everywhere, duplicate keys, ids of the wrong type, aliases of one
attribute) through both engines and through the streamed ``.json.gz`` path, and compare."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from converter_helpers import all_spans_pb, attr_dict, skip_unless_native

from otelprof.converter import ConvertOptions, ConvertResult, convert

pytestmark = pytest.mark.native


@pytest.fixture(autouse=True)
def _need_native() -> None:
    skip_unless_native()


def _x(name: str, cat: str, ts: int, dur: int, **args: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "X", "name": name, "cat": cat, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def _trace() -> str:
    """JSON text with duplicate keys (written by hand: a dict cannot hold them) and escapes."""
    events = [
        _x("ProfilerStep#3", "user_annotation", 0, 1000),
        # a category the table does not know, escaped; a name escaped; a string arg escaped
        _x("my\\u00e9op", "custom\\u0020cat", 10, 400, **{"Module Hierarchy": "a.\\u00fcb", "Call stack": "f\\nline"}),
        _x("aten::linear", "cpu_op", 20, 300, **{"Sequence number": 7, "Fwd thread id": 0, "Input type": ["float"]}),
        _x("aten::mm", "cpu_op", 30, 200, **{"Sequence number": "7", "Input Strides": [[1, 2]]}),
        _x("LinearBackward0", "cpu_op", 500, 300, **{"Sequence number": 7, "Fwd thread id": 1}),
        _x("OddBackward", "cpu_op", 520, 100, **{"Sequence number": 8, "Fwd thread id": "x"}),
        _x("cudaLaunchKernel", "cuda_runtime", 40, 20, correlation=11, **{"External id": 99}),
        {
            "ph": "X",
            "name": 'k\\"ernel',
            "cat": "kernel",
            "pid": 0,
            "tid": 7,
            "ts": 45,
            "dur": 50,
            "args": {"correlation": 11, "device": 0, "stream": 7, "grid": [1, 2, 3], "blocks per SM": 0.5},
        },
        _x("gpu_ann", "user_annotation", 41, 100, **{"External id": 5}),
        {
            "ph": "X",
            "name": "gpu_ann",
            "cat": "gpu_user_annotation",
            "pid": 0,
            "tid": 7,
            "ts": 44,
            "dur": 60,
            "args": {"External id": 5, "correlation": 11},
        },
        {
            "ph": "i",
            "s": "t",
            "name": "[memory]",
            "pid": 1,
            "tid": 1,
            "ts": 25,
            "args": {"Total Allocated": 1024, "Bytes": "big", "Device Type": 1, "Device Id": 0, "Addr": 4096},
        },
    ]
    text = json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1_000_000_000}, ensure_ascii=False)
    # json.dumps escapes the backslashes the events spell out: undo that, so the JSON has escapes
    text = text.replace("\\\\u", "\\u").replace("\\\\n", "\\n").replace('\\\\\\"', '\\"')
    # duplicate keys: the last wins, in args and in memory args, in both engines
    dup_dims = (
        '"args": {"Input Dims": [[9]], "External id": 1, "Input Dims": null, "Input dims": [[2, 3]], "External id": 2}'
    )
    dup_mem = '"args": {"Total Allocated": 5, "Total Allocated": "x", "Device Type": 0, "Device Type": 1}'
    extra = [
        '{"ph": "X", "name": "aten::add", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 60, "dur": 30, ' + dup_dims + "}",
        '{"ph": "X", "name": "aten::add", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 95, "dur": 30, '
        '"args": {"Input Dims": [[4], []], "Input dims": [[5]]}}',
        '{"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 70, ' + dup_mem + "}",
    ]
    return text.replace('"traceEvents": [', '"traceEvents": [' + ", ".join(extra) + ", ", 1)


def _both(data: bytes, **options: Any) -> tuple[ConvertResult, ConvertResult]:
    opts = ConvertOptions(**options)
    return convert(data, options=opts, engine="native"), convert(data, options=opts, engine="reference")


@pytest.mark.parametrize("options", [{"detail": "full"}, {"detail": "full", "group_by_input_shapes": True},
                                     {"detail": "default", "min_duration_ns": 0}])  # fmt: skip
def test_digested_args_match_reference(options: dict[str, Any]) -> None:
    text = _trace().encode()
    json.loads(text)  # valid JSON, as written
    native, reference = _both(text, **options)
    assert native.requests == reference.requests
    assert native.ops == reference.ops
    assert native.stats == reference.stats
    # the streamed path (inflated on a second thread, the text freed once read) gives the same bytes
    assert convert(gzip.compress(text), options=ConvertOptions(**options), engine="native").requests == native.requests


def test_digested_values_are_the_events_own() -> None:
    native, _ = _both(_trace().encode(), detail="full")
    spans = {s.name: s for s in all_spans_pb(native.requests)}
    odd = attr_dict(spans["myéop"].attributes)
    assert odd["otelprof.event.category"] == "custom cat"
    assert odd["otelprof.op.module_hierarchy"] == "a.üb"
    assert odd["code.stacktrace"] == "f\nline"
    adds = [attr_dict(s.attributes) for s in all_spans_pb(native.requests) if s.name == "aten::add"]
    # last duplicate wins ("Input Dims": null renders), the alias after it is not used; compact JSON
    assert [a.get("otelprof.op.input_dims") for a in adds] == ["null", "[[4],[]]"]
    assert adds[0]["otelprof.external_id"] == 2
    kernel = spans['k"ernel']
    assert attr_dict(kernel.attributes)["otelprof.gpu.grid"] == "[1,2,3]"
    assert kernel.parent_span_id == spans["cudaLaunchKernel"].span_id  # by correlation id
    links = {s.name: [link.span_id for link in s.links] for s in all_spans_pb(native.requests)}
    assert links["LinearBackward0"] == [spans["aten::linear"].span_id]  # sequence 7, forward thread 0
    assert links["OddBackward"] == []


def test_shapes_group_by_the_digested_dims() -> None:
    native, reference = _both(_trace().encode(), detail="full", group_by_input_shapes=True)
    rows = [(op.name, op.input_shapes) for op in native.ops if op.name == "aten::add"]
    assert sorted(rows) == [("aten::add", ""), ("aten::add", "[[4],[]]")]
    assert native.ops == reference.ops
