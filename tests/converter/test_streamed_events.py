"""The native reader takes the events of the root's "traceEvents" array while the JSON is parsed,
and reads the whole document again where that cannot decide. Documents that exercise where the
two ways meet (duplicate keys, metadata after the events, time bases, late syntax errors) must
convert exactly as the reference converts them, or be rejected by both."""

from __future__ import annotations

import json
from typing import Any

import pytest
from converter_helpers import skip_unless_native

from otelprof.converter import ConvertResult, TraceFormatError, convert

pytestmark = pytest.mark.native


@pytest.fixture(autouse=True)
def _need_native() -> None:
    skip_unless_native()


def _ev(ts: Any = 10, dur: Any = 20, **over: Any) -> str:
    ev: dict[str, Any] = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": ts, "dur": dur}
    ev.update(over)
    return json.dumps(ev)


def _args(**args: Any) -> str:
    return _ev(args=args)


_MEMORY = json.dumps(
    {
        "ph": "i",
        "cat": "cpu_instant_event",
        "name": "[memory]",
        "pid": 1,
        "tid": 2,
        "ts": 15,
        "args": {"Total Allocated": 5, "Bytes": 7, "Device Type": 0},
    }
)
_STEP = _ev(ts=5, dur=100, name="ProfilerStep#3", cat="user_annotation")
_EVENTS = "[" + ",".join([_STEP, _args(**{"External id": 3, "Input Dims": [[1, 2], []]}), _MEMORY, _ev(ts=30)]) + "]"
_BIG = 2**63 - 1

CASES = {
    "plain": '{"traceEvents": ' + _EVENTS + "}",
    "metadata-after-events": '{"traceEvents": ' + _EVENTS + ', "baseTimeNanoseconds": 1000, "traceName": "t"}',
    "metadata-before-events": '{"baseTimeNanoseconds": 1000, "traceEvents": ' + _EVENTS + "}",
    "base-null-after": '{"traceEvents": ' + _EVENTS + ', "baseTimeNanoseconds": null}',
    "base-bad-after": '{"traceEvents": ' + _EVENTS + ', "baseTimeNanoseconds": -1}',
    "base-bad-and-bad-event": '{"traceEvents": [' + _ev(ts="x") + '], "baseTimeNanoseconds": "b"}',
    "negative-ts-made-valid-by-base": '{"traceEvents": [' + _ev(ts=-5) + '], "baseTimeNanoseconds": 10000000}',
    "negative-ts-without-base": '{"traceEvents": [' + _ev(ts=-5) + "]}",
    "base-pushes-end-out-of-range": '{"traceEvents": ['
    + _ev(ts=1, dur=9e12)
    + '], "baseTimeNanoseconds": '
    + str(_BIG - 10**12)
    + "}",
    "base-pushes-instant-out-of-range": '{"traceEvents": [' + _MEMORY + '], "baseTimeNanoseconds": ' + str(_BIG) + "}",
    "base-at-the-limit": '{"traceEvents": [' + _ev(ts=0, dur=0) + '], "baseTimeNanoseconds": ' + str(_BIG) + "}",
    "events-twice-last-wins": '{"traceEvents": [' + _ev(name="first") + '], "traceEvents": ' + _EVENTS + "}",
    "events-twice-bad-first": '{"traceEvents": [' + _ev(ts="x") + '], "traceEvents": ' + _EVENTS + "}",
    "events-twice-bad-last": '{"traceEvents": ' + _EVENTS + ', "traceEvents": [' + _ev(ts="x") + "]}",
    "events-then-not-an-array": '{"traceEvents": ' + _EVENTS + ', "traceEvents": {"a": 1}}',
    "not-an-array-then-events": '{"traceEvents": 5, "traceEvents": ' + _EVENTS + "}",
    "events-then-null": '{"traceEvents": ' + _EVENTS + ', "traceEvents": null}',
    "nested-traceEvents-key": '{"x": {"traceEvents": [1, 2]}, "traceEvents": ' + _EVENTS + "}",
    "root-array": _EVENTS,
    "bad-event-then-syntax-error": '{"traceEvents": [' + _ev(ts="x") + ", " + _ev() + '], "a": [1,}',
    "bad-event-then-deep-nesting": '{"traceEvents": [' + _ev(ts="x") + '], "a": ' + "[" * 600 + "]" * 600 + "}",
    "bad-event-later": '{"traceEvents": [' + _ev() + ", " + _ev(dur=-1) + ", " + _ev(pid=1.5) + "]}",
    "event-not-an-object": '{"traceEvents": [' + _ev() + ', [1, {"args": {}}], 7, "s", null]}',
    "args-not-last": '{"traceEvents": [{"args": {"External id": 9, "grid": [1, [2, {"a": 3}]]}, "ph": "X", "name": "a",'
    ' "cat": "kernel", "pid": 0, "tid": 7, "ts": 3, "dur": 4, "stream": 7}]}',
    "args-duplicated": '{"traceEvents": [{"ph": "X", "name": "a", "args": {"External id": 1}, "pid": 0, "tid": 1,'
    ' "ts": 3, "dur": 4, "args": {"External id": 2, "Input Dims": [[3]]}, "zz": {"deep": [[[1]]]}}]}',
    "args-null-and-empty": '{"traceEvents": [' + _ev(args=None) + ", " + _ev(args={}) + "]}",
    "args-wrong-type": '{"traceEvents": [' + _ev(args=[1]) + "]}",
    "members-escaped": '{"traceEvents": [{"ph": "X", "n\\u0061me": "a\\"b", "pid": "p\\u00e9", "tid": "7",'
    ' "ts": 3, "dur": 4, "args": {"Call stack": "f\\nq"}}]}',
    "empty-events": '{"traceEvents": []}',
    "metadata-and-ignored-events": '{"traceEvents": [{"ph": "M", "name": "process_name", "args": {"name": "x"}},'
    ' {"ph": "C", "ts": 1}, ' + _ev() + "]}",
}


def _convert(data: bytes, engine: str, opts: dict[str, Any]) -> ConvertResult | None:
    try:
        return convert(data, engine=engine, **opts)
    except TraceFormatError:
        return None


@pytest.mark.parametrize("opts", [{"detail": "full"}, {"detail": "full", "base_time_ns": 2**40}], ids=["", "base"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_native_agrees_with_reference(name: str, opts: dict[str, Any]) -> None:
    data = CASES[name].encode()
    native, reference = (_convert(data, engine, opts) for engine in ("native", "reference"))
    assert (native is None) == (reference is None), f"native accepts: {native is not None}"
    if native is not None and reference is not None:
        assert native.requests == reference.requests
        assert native.ops == reference.ops
        assert native.stats == reference.stats
