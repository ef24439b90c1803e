"""Gzip input (converter/_load.py): many members, one inflation cap over all of them, no copy of
the inflated trace, and a gzip bomb stopped at the cap. Memory is measured with tracemalloc
(the bytes Python allocates), never with a clock."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import pytest
from converter_helpers import all_spans_pb, read_json_bytes, shared_trace

from otelprof.converter import TraceFormatError, _load, convert, load_bytes

MiB = 1024 * 1024


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
