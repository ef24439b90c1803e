"""Deterministic trace and span ids (mirrors native/src/ids.cpp).

FNV-1a 64 over a key, finished with the SplitMix64 mixer: cheap, stable across
platforms and languages, and well spread for backends that shard by trace id.
"""

from __future__ import annotations

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


def span_base(run_id: str, rank: str) -> int:
    return fnv1a64(f"span|{run_id}|{rank}".encode("utf-8", "surrogatepass"), SEED_HI)


def span_id(base: int, ordinal: int) -> bytes:
    value = mix64((base + ordinal * GOLDEN) & M64) or 1
    return value.to_bytes(8, "big")
