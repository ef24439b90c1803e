"""The native parse against a SIMD JSON library's floor, and the per-core ceiling that follows.

    python benchmarks/parse_floor.py [TRACE] [--rounds N] [--sdk-spans N]

Builds ``benchmarks/parse_floor.cpp`` against simdjson (Debian: ``libsimdjson-dev``; without
it, or without a C++ compiler, says so and exits 0) with ``-O3 -march=native``, and times, in
N interleaved rounds (balanced orders, ``benchmarks/orders.py``), on the largest shared trace
(or TRACE):
- simdjson: its DOM parse of the whole JSON (its fastest complete parse: every value validated
            and decoded into its tape), and its on-demand API decoding every value as a reader
            would (each the median of 3 in its process);
- native:   ``_native.convert`` on one thread, by phase (its parse also reads the events): the
            second of two back to back, so its build and encode are the warm ones (this VM
            faults memory in at very different speeds depending on what ran before);
- sdk:      the OpenTelemetry SDK path on --sdk-spans of the trace's spans (benchmarks/convert.py).
Prints the medians, the native parse against simdjson's, and the per-core ceiling: the
conversion's time with its parse (and reading of the events) replaced by simdjson's DOM parse
alone, its build and encode as measured: in spans/s and against the SDK path. The last line is
JSON (figures).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks.*, when run as a script

from benchmarks.convert import DEFAULT_DIR, sdk_run, sdk_sample, short  # noqa: E402
from benchmarks.orders import balanced_orders  # noqa: E402
from otelprof import _native  # noqa: E402
from otelprof.converter import ConvertOptions, load_bytes  # noqa: E402

SOURCE = Path(__file__).with_suffix(".cpp")
INSTALL = "apt-get install libsimdjson-dev"


def build(folder: Path) -> Path | str:
    """The floor program, built in ``folder``; or why it cannot be."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if not compiler:
        return "no C++ compiler on PATH"
    flags = ["-lsimdjson"]
    if shutil.which("pkg-config"):
        found = subprocess.run(["pkg-config", "--cflags", "--libs", "simdjson"], capture_output=True, text=True)
        if found.returncode == 0:
            flags = found.stdout.split()
    binary = folder / "parse_floor"
    cmd = [compiler, "-O3", "-march=native", "-std=c++17", str(SOURCE), "-o", str(binary), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return f"simdjson not found or the build failed ({INSTALL}):\n{done.stderr[-1500:]}"
    return binary


def simdjson_ms(binary: Path, json_path: Path) -> tuple[float, float, int]:
    """simdjson's DOM parse and on-demand read of the whole JSON, each the median of 3 runs in one
    process (ms), and the events."""
    out = subprocess.run([str(binary), str(json_path), "3"], capture_output=True, text=True, check=True)
    figures = json.loads(out.stdout)
    return statistics.median(figures["parse_ms"]), statistics.median(figures["visit_ms"]), int(figures["events"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", nargs="?", type=Path, help="a Kineto trace (default: the largest shared one)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; medians are reported")
    parser.add_argument("--sdk-spans", type=int, default=20000, help="spans pushed through the SDK path")
    args = parser.parse_args()
    trace = args.trace or max(DEFAULT_DIR.glob("*.json*"), key=lambda p: p.stat().st_size)

    with tempfile.TemporaryDirectory(prefix="otelprof-parse-floor-") as tmp:
        binary = build(Path(tmp))
        if isinstance(binary, str):
            print(f"skipped: {binary}")
            print(json.dumps({"skipped": binary.splitlines()[0]}))
            return 0
        data, _ = load_bytes(trace)
        json_path = Path(tmp) / "trace.json"
        json_path.write_bytes(data)
        options = ConvertOptions(detail="full", threads=1).as_native()
        out = _native.convert(data, options)
        spans = int(out.stats["spans"])
        sample = sdk_sample(list(out.requests), args.sdk_spans)
        del out

        floor, visit, native, phases, sdk = [], [], [], [], []
        events = 0
        orders = balanced_orders(["simdjson", "native", "sdk"])
        for k in range(args.rounds):
            for kind in orders[k % len(orders)]:
                if kind == "simdjson":
                    parse_ms, visit_ms, events = simdjson_ms(binary, json_path)
                    floor.append(parse_ms)
                    visit.append(visit_ms)
                elif kind == "native":
                    _native.convert(data, options)
                    start = time.perf_counter()
                    run = _native.convert(data, options)
                    native.append((time.perf_counter() - start) * 1e3)
                    phases.append({name: ns / 1e6 for name, ns in dict(run.phases).items()})
                else:
                    sdk.append(sdk_run(sample))

    def median(name: str) -> float:
        return statistics.median(p[name] for p in phases)

    t_floor, t_visit = statistics.median(floor), statistics.median(visit)
    t_native, t_parse = statistics.median(native), median("parse")
    rest = t_native - t_parse - median("read")  # build, free, encode and the call itself, as measured
    ceiling = spans / ((t_floor + rest) / 1e3)
    sdk_rate = len(sample) / statistics.median(sdk)
    print(f"trace      : {short(trace)}: {len(data) / 1e6:.1f} MB JSON, {events:,} events, {spans:,} spans")
    print(
        f"simdjson   : DOM parse {t_floor:.1f} ms ({len(data) / 1e3 / t_floor:,.0f} MB/s); on demand, every value "
        f"decoded {t_visit:.1f} ms"
    )
    print(
        f"native     : {t_native:.1f} ms on one thread ({spans / t_native * 1e3:,.0f} spans/s): parse (reading the "
        f"events too) {t_parse:.1f} = {t_parse / t_floor:.2f}x simdjson's DOM parse; build {median('build'):.1f}, "
        f"encode {median('encode'):.1f}"
    )
    print(f"sdk path   : {sdk_rate:,.0f} spans/s ({len(sample):,} spans)")
    now = spans / t_native * 1e3 / sdk_rate
    print(
        f"ceiling    : parse and read at simdjson's DOM parse, the rest as measured: {t_floor + rest:.1f} ms = "
        f"{ceiling:,.0f} spans/s = {ceiling / sdk_rate:.0f}x the SDK path per core (now {now:.0f}x)"
    )
    figures = {
        "events": events,
        "spans": spans,
        "simdjson_parse_ms": round(t_floor, 2),
        "simdjson_visit_ms": round(t_visit, 2),
        "native_ms": round(t_native, 2),
        "native_parse_ms": round(t_parse, 2),
        "parse_over_simdjson": round(t_parse / t_floor, 3),
        "native_spans_per_s": round(spans / t_native * 1e3),
        "ceiling_spans_per_s": round(ceiling),
        "sdk_spans_per_s": round(sdk_rate),
        "ceiling_over_sdk": round(ceiling / sdk_rate, 1),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
