"""Gzip input (converter/_load.py): many members, one inflation cap over all of them, no copy of
the inflated trace, and a gzip bomb stopped at the cap. Memory is measured with tracemalloc
(the bytes Python allocates), never with a clock. Every test runs on both inflaters (the native
core's and Python's), which must give the same bytes and the same errors."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from converter_helpers import KINETO_TRACES, all_spans_pb, read_json_bytes, shared_trace, skip_unless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.converter import TraceFormatError, _load, convert, load_bytes

MiB = 1024 * 1024
Gunzip = Callable[[bytes, str, int | None], bytearray]


def _native_gunzip() -> Gunzip:
    skip_unless_native()
    if _load._native is None:
        pytest.fail("otelprof._native was built without zlib: no native gunzip")
    return _load.gunzip


@pytest.fixture(autouse=True, params=["native", "python"])
def inflater(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test on each inflater: "python" hides the native one from load_bytes."""
    if request.param == "native":
        _native_gunzip()
    else:
        monkeypatch.setattr(_load, "_native", None)
    yield request.param


def _members(data: bytes, count: int) -> bytes:
    """``data`` as ``count`` concatenated gzip members (what ``cat a.gz b.gz`` makes)."""
    step = -(-len(data) // count)
    return b"".join(gzip.compress(data[i : i + step], 1) for i in range(0, len(data), step))


def _peak_traced(fn: object) -> int:
    tracemalloc.start()
    try:
        fn()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_thousand_members_convert_like_the_plain_trace(engine: str) -> None:
    path = shared_trace("critical_path__alexnet")
    plain = read_json_bytes(path)
    many = _members(plain, 1200)
    assert many.count(b"\x1f\x8b\x08") > 1000
    data, _ = load_bytes(many)  # was RecursionError: one recursion per member
    assert data == plain
    assert convert(many, engine=engine).requests == convert(plain, engine=engine).requests
    assert all_spans_pb(convert(many, engine=engine).requests)


def test_the_cap_counts_all_members_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_load, "MAX_TRACE_BYTES", 8 * MiB)
    one = gzip.compress(b"x" * (5 * MiB))
    assert len(load_bytes(one)[0]) == 5 * MiB
    with pytest.raises(TraceFormatError, match="exceeds 8388608 bytes"):
        load_bytes(one + one)  # 10 MiB over two members: each was under a per-member cap


def test_a_bomb_stops_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 GiB of zeros in ~1 MB of gzip: inflation stops one byte past the cap, so it holds at
    most the cap and one inflation step no larger than the cap (before: 64 MiB steps, 128 MiB)."""
    cap = 4 * MiB
    monkeypatch.setattr(_load, "MAX_TRACE_BYTES", cap)
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(64 * MiB)
    bomb = b"".join(packer.compress(zeros) for _ in range(16)) + packer.flush()
    assert len(bomb) < 2 * MiB

    def load() -> None:
        with pytest.raises(TraceFormatError, match=f"decompressed trace exceeds {cap} bytes"):
            load_bytes(bomb)

    assert _peak_traced(load) < 3 * cap


def test_inflating_makes_no_copy() -> None:
    """The inflated trace is the buffer it was inflated into: peak memory is the trace plus
    one inflation step, not twice the trace (a ``bytes(out)`` copy before)."""
    size = 96 * MiB
    packed = gzip.compress(b'{"traceEvents": []}' + b" " * (size - 19), 1)
    held: list[object] = []
    peak = _peak_traced(lambda: held.append(load_bytes(packed)))
    assert len(held[0][0]) == size  # type: ignore[index]
    assert peak < 1.5 * size


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (gzip.compress(b"[]") + gzip.compress(b"[]")[:12], "truncated gzip data"),
        (gzip.compress(b"[]")[:-8] + bytes(8) + gzip.compress(b"[]"), "corrupt gzip data"),
    ],
    ids=["truncated-second-member", "bad-crc-first-member"],
)
def test_a_bad_member_is_a_trace_format_error(data: bytes, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        load_bytes(data)


def test_trailing_bytes_after_the_members_are_ignored() -> None:
    data, _ = load_bytes(_members(b'{"traceEvents": []}', 3) + b"\n\0garbage")
    assert data == b'{"traceEvents": []}'


# --- native and Python inflaters: same bytes, same errors ---------------------------------


def _outcome(fn: Gunzip, data: bytes, limit: int | None) -> bytes | str:
    try:
        return bytes(fn(data, "<t>", limit))
    except TraceFormatError as exc:
        return str(exc)


#: A test that runs both inflaters itself: once, under the "native" parameter of ``inflater``.
BOTH_ITSELF = pytest.mark.parametrize("inflater", ["native"], indirect=True)


def _both(data: bytes, limit: int | None = None) -> bytes | str:
    native = _outcome(_native_gunzip(), data, limit)
    assert native == _outcome(_load.py_gunzip, data, limit)
    return native


@pytest.mark.parametrize("path", KINETO_TRACES, ids=lambda p: p.name[:40])
@BOTH_ITSELF
def test_native_inflates_shared_traces_like_python(path: Path, inflater: str) -> None:
    data = path.read_bytes()
    assert _both(data) == gzip.decompress(data)


def _stream() -> bytes:
    return _members(b'{"traceEvents": [' + b'{"ph": "X", "name": "aten::mm"},' * 40 + b"{}]}", 3)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda s: b"", "<t>: truncated gzip data"),
        (lambda s: s[:10], "<t>: truncated gzip data"),
        (lambda s: s + b"\x1f\x8b", "<t>: truncated gzip data"),
        (
            lambda s: s + b"\x1f\x8bgarbage!",
            "<t>: corrupt gzip data (Error -3 while decompressing data: unknown compression method)",
        ),
        (lambda s: s + b"\x1f", None),
        (
            lambda s: b"\x1f\x8bxx" + s,
            "<t>: corrupt gzip data (Error -3 while decompressing data: unknown compression method)",
        ),
        (
            lambda s: s[:-8] + bytes(8),
            "<t>: corrupt gzip data (Error -3 while decompressing data: incorrect data check)",
        ),
        (
            lambda s: s[:-1] + bytes([s[-1] ^ 1]),
            "<t>: corrupt gzip data (Error -3 while decompressing data: incorrect length check)",
        ),
    ],
    ids=[
        "empty",
        "header-only",
        "bare-magic",
        "garbage-member",
        "one-trailing-byte",
        "bad-method",
        "bad-crc",
        "bad-isize",
    ],
)
@BOTH_ITSELF
def test_crafted_streams_give_the_same_outcome(
    make: Callable[[bytes], bytes], expected: str | None, inflater: str
) -> None:
    stream = _stream()
    got = _both(make(stream))
    assert got == (gzip.decompress(stream) if expected is None else expected)


@BOTH_ITSELF
def test_every_truncation_and_cap_gives_the_same_outcome(inflater: str) -> None:
    stream = _stream()
    plain = gzip.decompress(stream)
    for cut in range(len(stream)):  # a cut inside a member is truncated; at a boundary, a prefix
        got = _both(stream[:cut])
        assert got == "<t>: truncated gzip data" or (isinstance(got, bytes) and plain.startswith(got))
    for cap in (0, 1, len(plain) // 3, len(plain) - 1):
        assert _both(stream, cap) == f"<t>: decompressed trace exceeds {cap} bytes"
    assert _both(stream, len(plain)) == plain


@BOTH_ITSELF
def test_native_and_python_agree_on_any_stream(inflater: str) -> None:
    """Random payloads in random members, cut, flipped or followed by garbage, under random caps."""

    @settings(max_examples=200, deadline=None)
    @given(
        payload=st.binary(max_size=3000) | st.text(alphabet="ab{}", max_size=20000).map(str.encode),
        members=st.integers(1, 6),
        damage=st.sampled_from(["none", "truncate", "flip", "garbage"]),
        where=st.floats(0, 1),
        byte=st.integers(0, 255),
        garbage=st.binary(max_size=12),
        limit=st.none() | st.integers(0, 25000),
    )
    def check(
        payload: bytes, members: int, damage: str, where: float, byte: int, garbage: bytes, limit: int | None
    ) -> None:
        stream = _members(payload, members) if payload else gzip.compress(b"")
        at = int(where * (len(stream) - 1))
        if damage == "truncate":
            stream = stream[:at]
        elif damage == "flip":
            stream = stream[:at] + bytes([stream[at] ^ (byte or 1)]) + stream[at + 1 :]
        elif damage == "garbage":
            stream += b"\x1f\x8b" + garbage if byte % 2 else garbage
        got = _both(stream, limit)
        if damage == "none":
            too_big = limit is not None and len(payload) > limit
            assert got == (f"<t>: decompressed trace exceeds {limit} bytes" if too_big else payload)

    check()
