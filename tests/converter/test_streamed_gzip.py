"""``convert()`` of gzip input parses while a second native thread inflates (convert_gzip.cpp).

Whatever the stream holds, the outcome must be the one of inflating first and converting the
bytes: the same requests, counters and op rows, or the same error text. Inputs are built so
that what the streamed parser sees at a time ends inside characters, escapes, numbers and
values longer than its read-ahead (1 MiB), and so that errors lie before, at and past it.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from pathlib import Path

import pytest
from converter_helpers import KINETO_TRACES, read_json_bytes, skip_unless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.converter import ConvertOptions, TraceFormatError, _load, convert, convert_bytes

MiB = 1024 * 1024
OPTIONS = ConvertOptions(detail="full")
Outcome = tuple[list[bytes], dict[str, int], list[object]] | str


@pytest.fixture(autouse=True)
def _native_only() -> None:
    skip_unless_native()


def _inflated_first(gz: bytes) -> Outcome:
    try:
        out = convert_bytes(_load.as_json(gz, "<bytes>"), OPTIONS, engine="native")
    except TraceFormatError as exc:
        return str(exc)
    return out.requests, out.stats, list(out.ops)


def _streamed(gz: bytes) -> Outcome:
    try:
        out = convert(gz, options=OPTIONS, engine="native")
    except TraceFormatError as exc:
        return str(exc)
    return out.requests, out.stats, list(out.ops)


def _same(gz: bytes) -> Outcome:
    streamed = _streamed(gz)
    assert streamed == _inflated_first(gz)
    return streamed


def _trace(size: int, name: str = "aten::mm", pad: str = "") -> bytes:
    """A Kineto trace of about ``size`` bytes: nested CPU ops with args, one step."""
    events = [
        {"ph": "X", "name": "ProfilerStep#3", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 0, "dur": 10**9}
    ]
    ts = 1
    while sum(len(json.dumps(e)) for e in events[-1:]) * len(events) < size:
        args = {"External id": ts, "Sequence number": ts // 3, "Input Dims": [[ts % 7, 3]], "note": pad}
        events.append(
            {
                "ph": "X",
                "name": f"{name}{ts % 5}",
                "cat": "cpu_op",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": 1,
                "args": args,
            }
        )
        ts += 2
    return json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "t"}, ensure_ascii=False).encode()


def _utf8_trace() -> bytes:
    """~5 MiB whose names are two-, three- and four-byte characters, so the inflater's 256 KiB
    steps end inside characters."""
    return _trace(5 * MiB, name="opé€𝄞", pad="ü" * 7)


@pytest.mark.parametrize("path", KINETO_TRACES, ids=lambda p: p.name[:40])
def test_shared_traces_convert_as_when_inflated_first(path: Path) -> None:
    gz = path.read_bytes()
    streamed = convert(path, options=OPTIONS, engine="native")
    first = convert_bytes(read_json_bytes(path), OPTIONS, engine="native")
    assert streamed.requests == first.requests
    assert streamed.stats == first.stats and streamed.ops == first.ops and streamed.window_id == first.window_id
    assert _streamed(gz) == _inflated_first(gz)


def test_characters_cut_by_the_inflater_steps() -> None:
    outcome = _same(gzip.compress(_utf8_trace(), 1))
    assert not isinstance(outcome, str) and outcome[1]["spans"] > 10_000


def test_members_that_end_inside_events() -> None:
    plain = _utf8_trace()
    step = len(plain) // 37
    many = b"".join(gzip.compress(plain[i : i + step], 1) for i in range(0, len(plain), step))
    assert not isinstance(_same(many), str)


def test_a_value_longer_than_the_read_ahead_is_parsed_again_whole() -> None:
    plain = _trace(3 * MiB, pad="x" * (3 * MiB))  # every event's args hold a 3 MiB string
    outcome = _same(gzip.compress(plain, 1))
    assert not isinstance(outcome, str)


def test_a_root_array_of_events() -> None:
    events = json.loads(_trace(4 * MiB))["traceEvents"]
    assert not isinstance(_same(gzip.compress(json.dumps(events).encode(), 1)), str)


@pytest.mark.parametrize("where", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize(
    "bad", [b"\xff", b"\xc3", b"\xed\xa0\x80", b'"', b"\\"], ids=["ff", "cut-2", "surrogate", "quote", "slash"]
)
def test_bad_bytes_anywhere_give_the_error_of_the_whole_text(where: float, bad: bytes) -> None:
    """Inside a name: bytes that break only the UTF-8 are found by the streamed validation."""
    plain = _utf8_trace()
    at = plain.rfind(b'"name": "', 0, max(int(len(plain) * where), 20)) + 10
    message = _same(gzip.compress(plain[:at] + bad + plain[at:], 1))
    assert isinstance(message, str)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "<bytes>: empty trace"),
        (b" \n\x0b\x0c\t\r", "<bytes>: empty trace"),
        (b'{"traceEvents": []} x', "invalid JSON at line 1 column 21: Extra data"),
        (b'{"traceEvents": [', "invalid JSON at line 1 column 18: Expecting value"),
    ],
)
def test_small_inputs(data: bytes, expected: str) -> None:
    assert _same(gzip.compress(data)) == expected


def test_a_whole_trace_in_a_truncated_stream_is_a_gzip_error() -> None:
    gz = gzip.compress(_trace(3 * MiB), 1)[:-8]  # the JSON is all there; the CRC and size are not
    assert _same(gz) == "<bytes>: truncated gzip data"


def test_a_corrupt_stream_is_a_gzip_error_before_any_json_error() -> None:
    gz = bytearray(gzip.compress(_trace(3 * MiB) + b" x", 1))
    gz[-6] ^= 0xFF  # the size in the trailer
    message = _same(bytes(gz))
    assert isinstance(message, str) and message.startswith("<bytes>: corrupt gzip data")


def test_the_cap_stops_a_stream_being_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_load, "MAX_TRACE_BYTES", 2 * MiB)
    assert _same(gzip.compress(_trace(4 * MiB), 1)) == f"<bytes>: decompressed trace exceeds {2 * MiB} bytes"


def test_a_path_names_itself_in_gzip_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b"[]")[:-3])
    with pytest.raises(TraceFormatError, match=f"^{path}: truncated gzip data$"):
        convert(path, engine="native")


_BASE = _trace(3 * MiB)


@settings(max_examples=30, deadline=None)
@given(at=st.integers(0, len(_BASE) - 1), byte=st.binary(min_size=1, max_size=3), drop=st.booleans())
def test_any_one_edit_gives_the_outcome_of_inflating_first(at: int, byte: bytes, drop: bool) -> None:
    plain = _BASE[:at] + (b"" if drop else byte) + _BASE[at + 1 :]
    _same(gzip.compress(plain, 1))


_BASE_GZ = gzip.compress(_BASE, 1)


@settings(max_examples=40, deadline=None)
@given(
    at=st.one_of(
        st.integers(0, 20), st.integers(len(_BASE_GZ) - 10, len(_BASE_GZ) - 1), st.integers(0, len(_BASE_GZ) - 1)
    ),
    xor=st.integers(1, 255),
    tail=st.sampled_from([b"", b"\x1f\x8b", gzip.compress(b" ")]),
)
def test_any_damaged_stream_gives_the_outcome_of_inflating_first(at: int, xor: int, tail: bytes) -> None:
    """Header, deflate data and trailer: where the fast inflater (ISA-L, if built with it) and
    zlib differ in what they reject or how they word it, zlib's verdict is the one given."""
    gz = bytearray(_BASE_GZ + tail)
    gz[at] ^= xor
    _same(bytes(gz))


def test_the_inflater_is_named() -> None:
    from otelprof import _native

    assert _native.streaming_inflater in ("isa-l", "zlib")


def _header(flags: int, extra: bytes = b"", method: int = 8) -> bytes:
    """A gzip member of a small trace with header ``flags`` (and their fields) set by hand."""
    body = zlib.compressobj(6, zlib.DEFLATED, -15)
    plain = b'{"traceEvents": []}'
    deflated = body.compress(plain) + body.flush()
    head = bytes([0x1F, 0x8B, method, flags, 0, 0, 0, 0, 0, 3]) + extra
    trailer = struct.pack("<II", zlib.crc32(plain), len(plain))
    return head + deflated + trailer


@pytest.mark.parametrize(
    "gz",
    [
        _header(0x20),
        _header(0x80),
        _header(0x04, b"\x03\x00abc"),
        _header(0x08, b"name\x00"),
        _header(0x10, b"comment\x00"),
        _header(0x02, b"\x00\x00"),  # a header CRC that is wrong
        _header(0x00, method=7),
        _header(0x00) + b"\x1f\x8b\x09",
    ],
    ids=["reserved-20", "reserved-80", "extra", "name", "comment", "bad-hcrc", "method-7", "bad-second-member"],
)
def test_header_fields_and_flags(gz: bytes) -> None:
    _same(gz)
