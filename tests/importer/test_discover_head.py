"""Discovery reads only as much of each file as it needs: a trace's first 64 KiB usually name
``traceEvents`` and ``distributedInfo``, and the verdicts must be those a whole 1 MiB head gives
(the one-shot read discovery did before, kept here as the oracle)."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest

from otelprof.importer import discover, find_sources
from otelprof.importer.discover import _DIST_INFO, _DIST_RANK, _HEAD_BYTES, _HEAD_STEP

from .helpers import SHARED


def _one_shot_head(path: Path) -> bytes:
    """The first MiB of the file, the first MiB of it inflated (as discovery read it before)."""
    raw = path.read_bytes()[:_HEAD_BYTES]
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(raw, _HEAD_BYTES)
    except zlib.error:
        return raw


def _oracle(path: Path) -> tuple[bool, int | None]:
    head = _one_shot_head(path)
    kineto = not head or b'"traceEvents"' in head or head.lstrip()[:1] == b"[" or head[:2] == b"\x1f\x8b"
    rank = None
    if (m := _DIST_INFO.search(head)) and (r := _DIST_RANK.search(head, m.end(), m.end() + 4096)):
        rank = int(r.group(1))
    return kineto, rank


def _verdicts(path: Path) -> tuple[bool, int | None]:
    return discover._looks_like_kineto(path), discover._inspect(path).trace_rank


def _trace(head: dict[str, object], events: int, tail: dict[str, object] | None = None) -> bytes:
    """A Kineto-like trace whose top-level members come in the given order."""
    body = [json.dumps({"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}) for i in range(events)]
    parts = [f'"{k}": {json.dumps(v)}' for k, v in head.items()] + ['"traceEvents": [\n' + ",\n".join(body) + "\n]"]
    parts += [f'"{k}": {json.dumps(v)}' for k, v in (tail or {}).items()]
    return ("{\n" + ",\n".join(parts) + "\n}").encode()


CASES = {
    # distributedInfo first (Kineto's order): found in the first step
    "rank_first": _trace({"distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 4}}, 20_000),
    # distributedInfo after traceEvents, still inside the first MiB: found once the head gets there
    "rank_after_events": _trace({}, 3_000, {"distributedInfo": {"rank": 5}}),
    # ... and past the first MiB: none, as before
    "rank_past_head": _trace({}, 30_000, {"distributedInfo": {"rank": 6}}),
    # the rank's digits cut by the first step's end must not read as a shorter number
    "rank_digits_at_step_end": b'{"pad": "' + b"x" * (_HEAD_STEP - 45) + b'", "distributedInfo": {"rank": 123456}, '
    b'"traceEvents": []}',
    # no distributedInfo at all: the whole head is read, and says so
    "no_rank": _trace({"schemaVersion": 1}, 20_000),
    # JSON that is not a trace, and one that starts after a long run of whitespace
    "config": json.dumps({"lr": 0.1, "pad": "y" * 200_000}).encode(),
    "late_bracket": b" " * (3 * _HEAD_STEP) + b'[{"ph": "X"}]',
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("gz", [False, True])
def test_verdicts_match_the_whole_head(tmp_path: Path, name: str, gz: bool) -> None:
    data = CASES[name]
    path = tmp_path / (f"{name}.json.gz" if gz else f"{name}.json")
    path.write_bytes(gzip.compress(data, 1) if gz and data else data)
    assert _verdicts(path) == _oracle(path)


def test_cut_digits_are_not_a_rank(tmp_path: Path) -> None:
    """The case above really puts the digits across the first step's end."""
    data = CASES["rank_digits_at_step_end"]
    at = data.index(b"123456")
    assert at < _HEAD_STEP < at + 6
    path = tmp_path / "t.json"
    path.write_bytes(data)
    assert discover._inspect(path).trace_rank == 123456


def test_corrupt_gzip_and_multi_member(tmp_path: Path) -> None:
    good = gzip.compress(CASES["rank_first"], 1)
    for name, data in {
        "truncated": good[: len(good) // 3],
        "garbage_late": good[:200] + bytes(range(256)) * 8,
        "garbage_header": b"\x1f\x8b" + bytes(range(256)) * 4,
        "two_members": gzip.compress(b'{"traceEvents": [], "x": 1}') + good,
    }.items():
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(data)
        assert _verdicts(path) == _oracle(path), name


def test_stops_reading_once_the_rank_is_found(tmp_path: Path) -> None:
    """A gzip corrupt past its first 64 KiB: the one-shot read met the corruption and lost the
    rank; the stepped read has the rank before it gets there (so it did not read that far)."""
    inflater = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    good = inflater.compress(CASES["rank_first"]) + inflater.flush()
    bad = good[: _HEAD_STEP // 2] + b"\xff" * (len(good) - _HEAD_STEP // 2)
    path = tmp_path / "rank1.pt.trace.json.gz"
    path.write_bytes(bad)
    assert _oracle(path) == (True, None)
    assert discover._inspect(path).trace_rank == 3


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")
def test_shared_traces_keep_their_verdicts() -> None:
    paths = sorted((SHARED / "kineto").glob("*.json.gz"))
    assert paths
    for path in paths:
        assert _verdicts(path) == _oracle(path), path.name
    assert {s.path.name for s in find_sources([SHARED / "kineto"])} == {p.name for p in paths}
