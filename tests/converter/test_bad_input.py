"""Bad input: every engine raises TraceFormatError (a ValueError) with a one-line reason,
and survivable oddities (lone surrogates, unknown categories/phases) convert."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import decode, shared_trace

from otelprof.converter import TraceFormatError, convert


def _event(**over: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::add",
        "pid": 1,
        "tid": 2,
        "ts": 100.5,
        "dur": 20.25,
    }
    ev.update(over)
    return {k: v for k, v in ev.items() if v is not _DROP}


_DROP = object()


def _doc(*events: dict[str, Any], **top: Any) -> bytes:
    body = {"schemaVersion": 1, "traceEvents": list(events) or [_event()], **top}
    return json.dumps(body).encode()


def _with_raw_event(raw_event: str) -> bytes:
    """A trace whose second event is the given JSON text (for literals json.dumps cannot write)."""
    return ('{"traceEvents": [' + json.dumps(_event()) + "," + raw_event + "]}").encode()


def _real(result: Any) -> list[Any]:
    """Decoded spans of a result, without the synthetic window root such tiny traces get."""
    return [s for s in decode(result).spans if not s.synthetic]


GOOD = _doc(_event(), _event(name="aten::mul", ts=200, dur=5))
GOOD_GZ = gzip.compress(GOOD)

BAD_INPUTS: list[tuple[str, bytes, str]] = [
    # (id, input, regex the message must match)
    ("empty", b"", r"(?i)empty"),
    ("whitespace", b" \n\t\r\n  ", r"(?i)empty"),
    ("truncated-json", GOOD[: len(GOOD) // 2], r"(?i)json"),
    ("truncated-json-1", GOOD[:-1], r"(?i)json"),
    ("truncated-gzip", GOOD_GZ[: len(GOOD_GZ) // 2], r"(?i)gzip"),
    ("truncated-gzip-header-only", GOOD_GZ[:10], r"(?i)gzip"),
    ("corrupt-gzip", GOOD_GZ[:12] + bytes(b ^ 0xFF for b in GOOD_GZ[12:-8]) + GOOD_GZ[-8:], r"(?i)gzip"),
    ("gzip-bad-crc", GOOD_GZ[:-8] + bytes(8), r"(?i)gzip"),
    ("not-json", b"hello, world", r"(?i)json"),
    ("not-json-binary", bytes(range(1, 256)), r"(?i)json|utf-8"),
    ("json-number", b"42", r"(?i)top level|object"),
    ("json-string", b'"traceEvents"', r"(?i)top level|object"),
    ("json-null", b"null", r"(?i)top level|object"),
    ("json-true", b"true", r"(?i)top level|object"),
    ("no-traceEvents", b'{"schemaVersion": 1}', r"traceEvents"),
    ("traceEvents-object", b'{"traceEvents": {"ph": "X"}}', r"traceEvents"),
    ("traceEvents-string", b'{"traceEvents": "[]"}', r"traceEvents"),
    ("traceEvents-null", b'{"traceEvents": null}', r"traceEvents"),
    ("event-number", _with_raw_event("7"), r"traceEvents\[1\]"),
    ("event-array", _with_raw_event('["X"]'), r"traceEvents\[1\]"),
    ("event-null", _with_raw_event("null"), r"traceEvents\[1\]"),
    ("ph-missing", _doc(_event(), _event(ph=_DROP)), r"traceEvents\[1\].*ph|ph.*traceEvents\[1\]"),
    ("ph-number", _doc(_event(), _event(ph=1)), r"traceEvents\[1\].*ph"),
    ("ph-null", _doc(_event(), _event(ph=None)), r"traceEvents\[1\].*ph"),
    ("ts-missing", _doc(_event(), _event(ts=_DROP)), r"traceEvents\[1\].*ts"),
    ("ts-string", _doc(_event(), _event(ts="100")), r"traceEvents\[1\].*ts"),
    ("ts-null", _doc(_event(), _event(ts=None)), r"traceEvents\[1\].*ts"),
    ("dur-missing", _doc(_event(), _event(dur=_DROP)), r"traceEvents\[1\].*dur"),
    ("dur-string", _doc(_event(), _event(dur="3")), r"traceEvents\[1\].*dur"),
    ("dur-negative", _doc(_event(), _event(dur=-1)), r"traceEvents\[1\].*dur"),
    ("dur-negative-float", _doc(_event(), _event(dur=-0.5)), r"traceEvents\[1\].*dur"),
    ("ts-negative", _doc(_event(), _event(ts=-5)), r"traceEvents\[1\].*ts"),
    ("ts-1e300", _with_raw_event('{"ph":"X","name":"a","pid":1,"tid":1,"ts":1e300,"dur":1}'), r"traceEvents\[1\].*ts"),
    ("dur-1e30", _with_raw_event('{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1e30}'), r"traceEvents\[1\].*dur"),
    (
        "ts-huge-int",
        _with_raw_event('{"ph":"X","name":"a","pid":1,"tid":1,"ts":123456789012345678901234567890,"dur":1}'),
        r"traceEvents\[1\].*ts",
    ),
    (
        "end-past-int64",
        _with_raw_event('{"ph":"X","name":"a","pid":1,"tid":1,"ts":9223372036854775,"dur":9223372036854775}'),
        r"traceEvents\[1\]",
    ),
    ("ts-nan", _with_raw_event('{"ph":"X","name":"a","pid":1,"tid":1,"ts":NaN,"dur":1}'), r"(?i)json|nan"),
    (
        "ts-infinity",
        _with_raw_event('{"ph":"X","name":"a","pid":1,"tid":1,"ts":Infinity,"dur":1}'),
        r"(?i)json|infinity",
    ),
    ("pid-float", _doc(_event(), _event(pid=1.5)), r"traceEvents\[1\].*pid"),
    ("pid-object", _doc(_event(), _event(pid={"a": 1})), r"traceEvents\[1\].*pid"),
    ("tid-bool", _doc(_event(), _event(tid=True)), r"traceEvents\[1\].*tid"),
    ("name-number", _doc(_event(), _event(name=5)), r"traceEvents\[1\].*name"),
    ("cat-array", _doc(_event(), _event(cat=["cpu_op"])), r"traceEvents\[1\].*cat"),
    ("args-array", _doc(_event(), _event(args=[1, 2])), r"traceEvents\[1\].*args"),
    (
        "flow-id-float",
        _doc(_event(), {"ph": "s", "cat": "fwdbwd", "id": 1.5, "pid": 1, "tid": 2, "ts": 101}),
        r"traceEvents\[1\]",
    ),
    ("base-time-negative", _doc(_event(), baseTimeNanoseconds=-1), r"baseTimeNanoseconds"),
    ("base-time-string", _doc(_event(), baseTimeNanoseconds="1"), r"baseTimeNanoseconds"),
    ("deep-nesting-open", b"[" * 100_000, r"(?i)json|nest|deep"),
    ("deep-nesting-closed", b"[" * 100_000 + b"]" * 100_000, r"(?i)json|nest|deep"),
    (
        "deep-nesting-in-args",
        _with_raw_event(
            '{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1,"args":{"x":' + "[" * 50_000 + "]" * 50_000 + "}}"
        ),
        r"(?i)json|nest|deep",
    ),
    ("invalid-utf8-name", GOOD.replace(b"aten::mul", b"aten::\xff\xfeul"), r"(?i)utf-?8"),
    ("invalid-utf8-overlong", GOOD.replace(b"aten::mul", b"aten::\xc0\xafmul"), r"(?i)utf-?8"),
    ("invalid-utf8-raw-surrogate", GOOD.replace(b"aten::mul", b"aten::\xed\xa0\x80"), r"(?i)utf-?8"),
    ("invalid-utf8-truncated-sequence", GOOD.replace(b"aten::mul", b"aten::\xe2\x82"), r"(?i)utf-?8"),
    ("control-char-in-string", GOOD.replace(b"aten::mul", b"aten::\x01mul"), r"(?i)json"),
    ("bad-escape", GOOD.replace(b"aten::mul", b"aten::\\qmul"), r"(?i)json"),
    ("trailing-garbage", GOOD + b" x", r"(?i)json"),
    ("two-documents", GOOD + GOOD, r"(?i)json"),
    ("single-quotes", b"{'traceEvents': []}", r"(?i)json"),
    ("trailing-comma", b'{"traceEvents": [],}', r"(?i)json"),
    ("leading-zero-number", _with_raw_event('{"ph":"X","name":"a","pid":1,"tid":1,"ts":01,"dur":1}'), r"(?i)json"),
]


@pytest.mark.parametrize("data,pattern", [pytest.param(d, p, id=i) for i, d, p in BAD_INPUTS])
def test_bad_input_raises_trace_format_error(engine: str, data: bytes, pattern: str) -> None:
    with pytest.raises(TraceFormatError) as info:
        convert(data, engine=engine, detail="full")
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert message and "\n" not in message.strip(), f"one-line reason expected, got {message!r}"
    assert len(message) < 500
    assert re.search(pattern, message), f"message {message!r} does not match {pattern!r}"


def test_gzip_variants_of_bad_json(engine: str) -> None:
    """Errors inside a gzip member are the JSON's, not the container's."""
    with pytest.raises(TraceFormatError, match=r"traceEvents\[1\].*ts"):
        convert(gzip.compress(_doc(_event(), _event(ts="x"))), engine=engine)


def test_missing_file(engine: str, tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"(?i)cannot read"):
        convert(tmp_path / "nope.json", engine=engine)


def test_directory_is_not_a_trace(engine: str, tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError):
        convert(tmp_path, engine=engine)


def test_good_baseline(engine: str) -> None:
    """The documents the bad cases are cut from are fine."""
    for data in (GOOD, GOOD_GZ):
        spans = _real(convert(data, engine=engine, detail="full"))
        assert [(s.name, s.start, s.end) for s in spans] == [
            ("aten::add", 100_500, 120_750),
            ("aten::mul", 200_000, 205_000),
        ]


def test_array_top_level_is_accepted(engine: str) -> None:
    data = json.dumps([_event(), _event(name="x", ts=300, dur=1)]).encode()
    assert sorted(s.name for s in _real(convert(data, engine=engine, detail="full"))) == ["aten::add", "x"]


def test_empty_trace_events(engine: str) -> None:
    result = convert(b'{"traceEvents": []}', engine=engine, detail="full")
    assert result.requests == [] or decode(result).spans == []
    assert result.stats["events_total"] == 0 and result.stats["spans"] == 0


def test_concatenated_gzip_members(engine: str) -> None:
    data = gzip.compress(GOOD[:10]) + gzip.compress(GOOD[10:])
    assert [s.name for s in _real(convert(data, engine=engine, detail="full"))] == ["aten::add", "aten::mul"]


@pytest.mark.parametrize(
    "escaped,expected",
    [
        ("a\\ud800b", "a\ufffdb"),
        ("\\udfff", "\ufffd"),
        ("x\\ud800\\ud800y", "x\ufffd\ufffdy"),
        ("pair \\ud83d\\ude00 ok", "pair \U0001f600 ok"),
        ("reversed \\ude00\\ud83d", "reversed \ufffd\ufffd"),
    ],
)
def test_lone_surrogate_escapes_become_replacement_char(engine: str, escaped: str, expected: str) -> None:
    raw = (
        '{"traceEvents": [{"ph":"X","cat":"cpu_op","name":"' + escaped + '","pid":1,"tid":2,"ts":1,"dur":2,'
        '"args":{"Module Hierarchy":"m' + escaped + '"}}]}'
    ).encode()
    (span,) = _real(convert(raw, engine=engine, detail="full"))
    assert span.name == expected
    assert span.attrs["otelprof.op.module_hierarchy"] == "m" + expected


def test_lone_surrogate_in_category_and_thread(engine: str) -> None:
    raw = b'{"traceEvents": [{"ph":"X","cat":"c\\ud800","name":"n","pid":"p\\udc00","tid":"t","ts":1,"dur":2}]}'
    (span,) = _real(convert(raw, engine=engine, detail="full"))
    assert span.attrs["otelprof.event.category"] == "c\ufffd"
    assert "thread.id" not in span.attrs  # string tids carry no thread.id


def test_unknown_category_is_a_generic_cpu_span(engine: str) -> None:
    data = _doc(
        _event(name="outer", ts=0, dur=100),
        _event(cat="my_new_category", name="mystery", ts=10, dur=50, args={"foo": 1, "correlation": 7}),
    )
    d = decode(convert(data, engine=engine, detail="full"))
    outer, mystery = (next(s for s in d.spans if s.name == n) for n in ("outer", "mystery"))
    assert mystery.category == "my_new_category"
    assert mystery.attrs["thread.id"] == 2
    assert mystery.parent_id == outer.span_id  # nests by time like any CPU-side span
    assert mystery.attrs["otelprof.gpu.correlation_id"] == 7  # known argument keys still map
    assert "foo" not in mystery.attrs and not any("foo" in k for k in mystery.attrs)
    assert "otelprof.op.self_cpu_time_ns" not in mystery.attrs  # not part of key_averages
    assert [o.name for o in convert(data, engine=engine, detail="full").ops] == ["outer"]


def test_missing_category_and_name(engine: str) -> None:
    data = _doc(_event(cat=_DROP, name=_DROP), _event(cat=None, name=None, ts=500))
    assert [(s.name, s.category) for s in _real(convert(data, engine=engine, detail="full"))] == [("", ""), ("", "")]


@pytest.mark.parametrize("ph", ["B", "E", "C", "b", "e", "n", "P", "O", "N", "D", "R", "Z", "", "XX", "x"])
def test_unknown_phase_is_ignored_and_counted(engine: str, ph: str) -> None:
    data = _doc(
        _event(), {"ph": ph, "name": "odd", "pid": 1, "tid": 2, "ts": "not even a number"}, _event(name="b", ts=900)
    )
    result = convert(data, engine=engine, detail="full")
    assert result.stats["ignored_events"] == 1
    assert result.stats["events_total"] == 3
    assert [s.name for s in _real(result)] == ["aten::add", "b"]


def test_metadata_instants_and_foreign_flows_are_counted(engine: str) -> None:
    data = _doc(
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        _event(),
        {"ph": "i", "name": "some instant", "pid": 1, "tid": 2, "ts": 101, "s": "t"},
        {"ph": "s", "cat": "other_flow", "id": 3, "pid": 1, "tid": 2, "ts": 101},
        {"ph": "f", "cat": "ac2g", "id": 3, "pid": 1, "tid": 2, "ts": 101},
    )
    st = convert(data, engine=engine, detail="full").stats
    assert st["metadata_events"] == 1
    assert st["ignored_events"] == 2  # the non-memory instant and the flow of an unknown category
    assert st["flow_events"] == 1
    assert st["complete_events"] == 1


def test_string_and_odd_identifiers(engine: str) -> None:
    data = _doc(
        _event(pid="Spans", tid="", name="a", ts=0, dur=10),
        _event(pid="7", tid="12", name="b", ts=0, dur=10),
        _event(pid=7, tid=12, name="c", ts=1, dur=2),
        _event(pid=None, tid=None, name="d", ts=0, dur=10),
    )
    spans = {s.name: s for s in _real(convert(data, engine=engine, detail="full"))}
    assert "thread.id" not in spans["a"].attrs
    assert spans["b"].attrs["thread.id"] == 12  # a canonical decimal string is the integer id
    assert spans["c"].parent_id == spans["b"].span_id  # "7"/"12" and 7/12 are the same thread


def test_duplicate_keys_last_wins(engine: str) -> None:
    raw = b'{"traceEvents": [{"ph":"X","name":"first","name":"second","pid":1,"tid":1,"ts":1,"dur":1,"dur":3}]}'
    assert [(s.name, s.end - s.start) for s in _real(convert(raw, engine=engine, detail="full"))] == [("second", 3000)]


def test_real_trace_prefix_is_rejected(engine: str) -> None:
    data = gzip.decompress(shared_trace("cpu_only__rank-34").read_bytes())
    for cut in (1, len(data) // 3, len(data) - 2):
        with pytest.raises(TraceFormatError):
            convert(data[:cut], engine=engine)


def _nested_arg(depth: int) -> bytes:
    return (
        '{"traceEvents": [{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1,'
        '"args":{"Input Dims":' + "[" * depth + "]" * depth + "}}]}"
    ).encode()


@pytest.mark.parametrize("depth", [200, 508])
def test_moderately_deep_argument_converts(engine: str, depth: int) -> None:
    """Nesting up to the parser's limit (512 levels in all) is rendered back compactly."""
    (span,) = _real(convert(_nested_arg(depth), engine=engine, detail="full"))
    assert span.attrs["otelprof.op.input_dims"] == "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [509, 700, 2_000])
def test_too_deep_argument_is_a_format_error(engine: str, depth: int) -> None:
    """Deep nesting inside an event is refused the same way as deep nesting at the top: both
    engines stop past 512 levels (the args value sits 4 levels down, so 509 is one too many)."""
    with pytest.raises(TraceFormatError, match=r"(?i)nest|deep"):
        convert(_nested_arg(depth), engine=engine, detail="full")
