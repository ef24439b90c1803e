"""Inflating ``.json.gz`` traces: the native core (zlib from C++, GIL released) against Python's
zlib loop (converter/_load.py's ``py_gunzip``), interleaved in one run, medians and the ratio;
native conversion from the ``.json.gz`` path (native inflate, then Python's) against conversion
of the same JSON from bytes, interleaved; then a gzip bomb (1 GiB of zeros in ~1 MB) against the
default 4 GiB cap and a small cap, wall time and peak RSS each in a fresh child process.

    python benchmarks/inflate.py [TRACE] [--repeat N] [--no-bomb]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from otelprof.converter import ConvertOptions, TraceFormatError, _load, convert_bytes, load_bytes

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (
    ROOT.parent / "shared" / "traces" / "kineto" / "hta__tests__data__df_index_resolver__df_index_resolver.json.gz"
)
MiB = 1024 * 1024

# Child: inflate the bomb once with one inflater under one cap; print wall, RSS growth, outcome.
_CHILD = """
import json, resource, sys, time
from otelprof.converter import TraceFormatError, _load
path, which, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(path, "rb").read()
fn = _load.gunzip if which == "native" else _load.py_gunzip
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
try:
    outcome = f"{len(fn(data, 'bomb', cap))} bytes"
except TraceFormatError as exc:
    outcome = str(exc)
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall_s": wall, "rss_before_mib": before / 1024, "rss_peak_mib": peak / 1024, "outcome": outcome}))
"""


def inflate_medians(data: bytes, repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"native": [], "python": []}
    sizes = set()
    for _ in range(repeat):  # interleaved: both see the same machine load
        for name, fn in (("native", _load.gunzip), ("python", _load.py_gunzip)):
            start = time.perf_counter()
            out = fn(data, "<bench>", None)
            times[name].append(time.perf_counter() - start)
            sizes.add(len(out))
            del out
    assert len(sizes) == 1
    return {k: statistics.median(v) for k, v in times.items()} | {"size": float(sizes.pop())}


def end_to_end_medians(path: Path, repeat: int) -> dict[str, float]:
    """Native conversion (detail="full") from the gzip path, with each inflater, and from bytes."""
    opts = ConvertOptions(detail="full")
    plain = bytes(load_bytes(path)[0])
    native = _load._native
    times: dict[str, list[float]] = {"bytes": [], "gz native": [], "gz python": []}
    try:
        for _ in range(repeat):
            for name in times:
                _load._native = None if name == "gz python" else native
                start = time.perf_counter()
                convert_bytes(plain if name == "bytes" else load_bytes(path)[0], opts, "native")
                times[name].append(time.perf_counter() - start)
    finally:
        _load._native = native
    return {k: statistics.median(v) for k, v in times.items()}


def bomb_runs() -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(64 * MiB)
    bomb = b"".join(packer.compress(zeros) for _ in range(16)) + packer.flush()
    del zeros
    print(f"\nbomb: {len(bomb) / 1e6:.2f} MB of gzip -> 1 GiB of zeros (each run a fresh child process)")
    with tempfile.NamedTemporaryFile(suffix=".gz") as f:
        f.write(bomb)
        f.flush()
        for cap in (_load.MAX_TRACE_BYTES, 4 * MiB):
            for which in ("native", "python"):
                res = subprocess.run(
                    [sys.executable, "-c", _CHILD, f.name, which, str(cap)], capture_output=True, text=True, check=True
                )
                r = json.loads(res.stdout)
                grew = r["rss_peak_mib"] - r["rss_before_mib"]
                print(
                    f"  cap {cap / MiB:>6.0f} MiB  {which:<6}  {r['wall_s'] * 1e3:8.1f} ms  "
                    f"peak RSS +{grew:7.1f} MiB  -> {r['outcome']}"
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--no-bomb", action="store_true")
    args = parser.parse_args()
    if _load._native is None:
        print("otelprof._native has no gunzip (not built, or built without zlib)")
        return 1
    data = args.trace.read_bytes()
    try:
        m = inflate_medians(data, args.repeat)
    except TraceFormatError as exc:
        print(exc)
        return 1
    print(f"{args.trace.name}: {len(data) / 1e6:.1f} MB gzip -> {m['size'] / 1e6:.1f} MB JSON, median of {args.repeat}")
    for name in ("native", "python"):
        print(f"  {name:<6} {m[name] * 1e3:8.1f} ms  {m['size'] / m[name] / 1e6:8.0f} MB/s out")
    print(f"  python/native: {m['python'] / m['native']:.2f}x")
    e2e = end_to_end_medians(args.trace, max(3, args.repeat // 3))
    print(f"native convert, detail=full, median of {max(3, args.repeat // 3)}:")
    for name, wall in e2e.items():
        print(f"  from {name:<10} {wall * 1e3:8.1f} ms  {wall / e2e['bytes']:5.2f}x of from bytes")
    if not args.no_bomb:
        bomb_runs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
