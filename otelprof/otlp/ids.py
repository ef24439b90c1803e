"""Deterministic trace and span ids (mirrors native/include/otelprof/ids.hpp).

FNV-1a 64 over a key, finished with the SplitMix64 mixer: cheap, stable across
platforms and languages, and well spread for backends that shard by trace id.
"""

from __future__ import annotations

from collections.abc import Iterable

M64 = (1 << 64) - 1
SEED_HI = 0xCBF29CE484222325
SEED_LO = 0x84222325CBF29CE4
GOLDEN = 0x9E3779B97F4A7C15


def fnv1a64(data: bytes, seed: int) -> int:
    h = seed
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & M64
    return h


def mix64(z: int) -> int:
    z = (z + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def trace_id(key: str) -> bytes:
    raw = key.encode("utf-8", "surrogatepass")
    hi, lo = mix64(fnv1a64(raw, SEED_HI)), mix64(fnv1a64(raw, SEED_LO))
    if hi == 0 and lo == 0:
        lo = 1
    return hi.to_bytes(8, "big") + lo.to_bytes(8, "big")


class TraceIds:
    """``trace_id(prefix + suffix)`` for one prefix and many suffixes (``step|run|`` + N):
    FNV-1a runs byte by byte, so its state after the prefix is kept and only the suffix is
    hashed per call."""

    def __init__(self, prefix: str) -> None:
        raw = prefix.encode("utf-8", "surrogatepass")
        self._hi, self._lo = fnv1a64(raw, SEED_HI), fnv1a64(raw, SEED_LO)

    def __call__(self, suffix: str) -> bytes:
        raw = suffix.encode("utf-8", "surrogatepass")
        hi, lo = mix64(fnv1a64(raw, self._hi)), mix64(fnv1a64(raw, self._lo))
        if hi == 0 and lo == 0:
            lo = 1
        return hi.to_bytes(8, "big") + lo.to_bytes(8, "big")


def window_id(bounds: Iterable[tuple[int, int]], total: int) -> str:
    """16 hex digits naming one profiling window by its content: a fold of every complete
    event's (start, end) in file order and the count of all events. Several windows or files of
    one run and rank get their own span ids from it; the same file always the same."""
    h = SEED_HI
    for start, end in bounds:
        h = ((h ^ (start & M64)) * GOLDEN) & M64
        h ^= h >> 32
        h = ((h ^ (end & M64)) * GOLDEN) & M64
        h ^= h >> 32
    return f"{mix64(h ^ (total & M64)):016x}"


def span_base(run_id: str, rank: str, window: str = "") -> int:
    """Base of the span ids of one (run, rank[, window]); the live step spans pass no window."""
    key = f"span|{run_id}|{rank}|{window}" if window else f"span|{run_id}|{rank}"
    return fnv1a64(key.encode("utf-8", "surrogatepass"), SEED_HI)


def span_id(base: int, ordinal: int) -> bytes:
    value = mix64((base + ordinal * GOLDEN) & M64) or 1
    return value.to_bytes(8, "big")
