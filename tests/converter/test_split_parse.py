"""With ``threads=2`` a second thread parses a large trace's events from an element near the middle
of the JSON while the first parses up to it, then takes the second's events (TraceReader::split).
The second parser starts at the first "}, {" (whitespace aside) past the middle: where that is
not one of the root's "traceEvents" elements (a nested array, a string), or its part fails, its
work is dropped. Either way the output must be one
thread's, byte for byte, and a bad trace must fail with one thread's error.

``split_from_bytes=0`` splits documents of any size; ``phases["parse_tail"]`` tells whether the
second parser's events were taken (its time in ns), so each case also checks which way it went.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import KINETO_TRACES, cpu_op_event, skip_unless_native

from otelprof.converter import ConvertOptions

pytestmark = pytest.mark.native


@pytest.fixture(autouse=True)
def _need_native() -> None:
    skip_unless_native()


def _convert(data: bytes, threads: int, **fields: Any) -> tuple[Any, ...]:
    """(requests, ops, stats, window id, second parser taken), or ("error", message)."""
    from otelprof import _native

    options = {**ConvertOptions(**fields).as_native(), "threads": threads, "split_from_bytes": 0}
    try:
        out = _native.convert(data, options)
    except _native.TraceError as exc:
        return ("error", str(exc))
    columns = (
        "name",
        "kind",
        "input_shapes",
        "calls",
        "cpu_total_ns",
        "self_cpu_ns",
        "device_total_ns",
        "self_device_ns",
    )
    ops = [tuple(getattr(o, c) for c in columns) for o in out.ops]
    return (list(out.requests), ops, dict(out.stats), out.window_id, out.phases["parse_tail"] > 0)


def _same_as_one_thread(data: bytes, **fields: Any) -> bool:
    """Asserts two threads give one thread's output; returns whether the second parser's part was taken."""
    one, two = _convert(data, 1, **fields), _convert(data, 2, **fields)
    if one[0] == "error":
        assert two == one
        return False
    assert one[4] is False, "one thread never splits"
    assert two[:4] == one[:4]
    return bool(two[4])


_event = cpu_op_event


def _kineto(events: list[Any], head: str = "", tail: str = "") -> bytes:
    """Events laid out as Kineto writes them: one per line, after ",\\n"."""
    body = ",\n  ".join(json.dumps(e) for e in events)
    return ('{\n  "schemaVersion": 1,' + head + '\n  "traceEvents": [\n  ' + body + "\n  ]" + tail + "\n}").encode()


@pytest.mark.parametrize("detail", ["full", "default"])
@pytest.mark.parametrize("path", KINETO_TRACES, ids=lambda p: p.name[:60])
def test_shared_traces_split_and_convert_the_same(path: Path, detail: str) -> None:
    data = gzip.decompress(path.read_bytes())
    assert _same_as_one_thread(data, detail=detail), "the middle of every shared trace is in its events"


def test_what_only_the_second_half_has() -> None:
    # names, steps, string pids (one escaped), flows and memory events first seen past the middle
    # get the ids one parser reading on would give them
    first = [_event(k, tid="main" if k % 2 else 2) for k in range(200)]  # a string id the first half gives
    # string ids the second half sees in another order than one parser would: "other" first
    second = [_event(k, name=f"late::op{k % 5}", tid="other" if k < 300 else "main") for k in range(200, 400)]
    second[5] = _event(205, pid="w\u00e9rker", tid="t" + str(205 % 2))
    second[10] = _event(210, name="ProfilerStep#7", cat="user_annotation", dur=5000)
    second[20] = {"ph": "s", "cat": "fwdbwd", "id": 9, "pid": 1, "tid": 2, "ts": 1200, "name": "fwdbwd"}
    second[30] = {"ph": "f", "cat": "fwdbwd", "id": 9, "pid": 1, "tid": 2, "ts": 3300, "bp": "e", "name": "fwdbwd"}
    second[40] = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": "w\u00e9rker", "tid": 5,
                  "ts": 3400, "args": {"Total Allocated": 5, "Bytes": 7}}  # fmt: skip
    second[50] = _event(250, cat="Something New", args={"Call stack": 'a\\b"c', "Input Dims": [[1, 2]]})
    data = _kineto(first + second).replace(b'"w\\u00e9rker"', b'"w\\u00e9rk\\u0065r"', 1)
    for detail in ("full", "default"):
        assert _same_as_one_thread(data, detail=detail)


@pytest.mark.parametrize("threads_seen", [53, 59])
def test_string_ids_as_one_parser_gives_them(threads_seen: int) -> None:
    # Every event nests in the one before it on its thread; string thread ids cycle, so the second
    # parser first sees one the first saw later (whatever event it starts at): ids it gave
    # itself, kept, would put its events on other threads, under other parents. A flow's string
    # id starts in the first half and ends in the second.
    events: list[dict[str, Any]] = [
        _event(k, pid="proc", tid=f"t{k % threads_seen}", ts=1000 + k, dur=100_000 - 2 * k) for k in range(400)
    ]
    flow = {"cat": "fwdbwd", "id": "flow-1", "pid": "proc", "name": "fwdbwd"}
    events[3] = {**flow, "ph": "s", "tid": "t3", "ts": 1003}
    events[396] = {**flow, "ph": "f", "bp": "e", "tid": f"t{396 % threads_seen}", "ts": 1396}
    assert _same_as_one_thread(_kineto(events), detail="full")


def test_split_inside_an_events_args_is_dropped() -> None:
    # the middle falls inside one event's args, whose array of objects is laid out a line each
    nested = {"rows": [{"k": k} for k in range(3000)]}
    events = [_event(0), _event(1, args=nested), _event(2)]
    body = ",\n  ".join(json.dumps(e, indent=1) if "rows" in e["args"] else json.dumps(e) for e in events)
    data = ('{"traceEvents": [\n  ' + body + "\n]}").encode()
    assert b",\n  {" in data[len(data) // 2 :]
    assert not _same_as_one_thread(data, detail="full")


def test_split_after_the_events_is_dropped() -> None:
    # the events end before the middle; the rest of the root has elements a line each
    props = ",\n    ".join(json.dumps({"id": k, "name": "GPU"}) for k in range(3000))
    data = _kineto([_event(k) for k in range(20)], tail=',\n  "deviceProperties": [\n    ' + props + "\n  ]")
    assert not _same_as_one_thread(data, detail="full")


def test_compact_json_is_split() -> None:
    data = json.dumps({"traceEvents": [_event(k) for k in range(500)]}, separators=(",", ":")).encode()
    assert b"\n" not in data
    assert _same_as_one_thread(data, detail="full")


def test_split_inside_a_string_is_dropped() -> None:
    # the middle falls in a string holding what looks like events
    fake = ",".join(json.dumps(_event(k)) for k in range(300)).replace('"', "'")
    events = [_event(0), _event(1, args={"Call stack": fake}), _event(2)]
    data = json.dumps({"traceEvents": events}).encode()
    middle = data[len(data) // 2 :]
    assert middle.index(b"},{") < middle.index(b'"')
    assert not _same_as_one_thread(data, detail="full")


def test_nothing_to_split_at() -> None:
    data = json.dumps({"traceEvents": [_event(0)], "padding": "x" * 5000}).encode()
    assert not _same_as_one_thread(data, detail="full")


def test_the_last_events_array_is_the_one_split() -> None:
    # a duplicate "traceEvents": the last wins, and that is the one the middle falls in
    early = json.dumps([_event(k, name="first") for k in range(3)])
    data = _kineto([_event(k) for k in range(600)], head='\n  "traceEvents": ' + early + ",")
    assert _same_as_one_thread(data, detail="full")


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b'"ts": "soon"', id="bad-event"),
        pytest.param(b'"dur": -1', id="negative-duration"),
        pytest.param(b'"ts": 1,,', id="syntax-error"),
        pytest.param(b'"ts": tru', id="bad-literal"),
        pytest.param(b'"ts": 1, "x": "\xff"', id="invalid-utf8"),
        pytest.param(b'"ts": 1, "x": ' + b"[" * 600 + b"]" * 600, id="too-deep"),
        pytest.param(b'"ts": 1, "x": "a\x01"', id="control-character"),
    ],
)
def test_an_error_past_the_middle_is_one_threads_error(bad: bytes) -> None:
    events = [_event(k) for k in range(400)]
    events[-2]["ts"] = 7777777  # in the second parser's part
    broken = _kineto(events).replace(b'"ts": 7777777', bad)
    assert broken.index(bad) > len(broken) // 2
    one = _convert(broken, 1, detail="full")
    assert one[0] == "error"
    assert _convert(broken, 2, detail="full") == one


def test_a_time_base_after_the_events_checks_the_second_parsers_times() -> None:
    # the base that follows the events puts the latest end, in the second half, out of range
    events = [_event(k) for k in range(400)]
    events[-3]["ts"] = 9_000_000_000_000
    base = 2**63 - 1 - 9_000_000_000_000 * 1000
    one = _convert(_kineto(events, tail=f',\n  "baseTimeNanoseconds": {base}'), 1, detail="full")
    assert one[0] == "error"
    assert _convert(_kineto(events, tail=f',\n  "baseTimeNanoseconds": {base}'), 2, detail="full") == one
    assert _same_as_one_thread(_kineto(events, tail=f',\n  "baseTimeNanoseconds": {base // 2}'), detail="full")


def test_a_truncated_trace_is_one_threads_error() -> None:
    data = _kineto([_event(k) for k in range(400)])
    for cut in (len(data) - 3, len(data) * 3 // 4):
        one = _convert(data[:cut], 1, detail="full")
        assert one[0] == "error"
        assert _convert(data[:cut], 2, detail="full") == one


def test_threads_option() -> None:
    assert ConvertOptions().threads == 2
    assert ConvertOptions(threads=1).as_native()["threads"] == 1
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="threads must be an integer >= 1"):
            ConvertOptions(threads=bad)  # type: ignore[arg-type]
