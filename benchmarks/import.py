"""End-to-end ``otelprof import`` throughput: every shared Kineto trace (or the PATHs given)
imported to a local OTLP/gRPC receiver, against plain conversion of the same files measured
in the same run (the anchor: what the import costs beyond converting).

    python benchmarks/import.py [PATH ...] [--repeat N] [--detail default|full] [--compression gzip]

The import runs as the CLI does (discovery, conversion, batches through the background
Exporter, ledger writes, final flush); the receiver, in a separate process so it does not share
our GIL, decodes every request and must report exactly the spans the conversion produced.
Conversion and import alternate N times; prints the medians in events/s (input trace events,
as the progress line counts them) and their ratio. Target (issue 18): import / convert >= 0.8.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks.export, when run as a script

from benchmarks.export import Receiver  # noqa: E402
from otelprof.cli import main as cli_main  # noqa: E402
from otelprof.importer import convert_source, find_sources  # noqa: E402
from otelprof.resource import options_from_env  # noqa: E402

DEFAULT_PATH = ROOT.parent / "shared" / "traces" / "kineto"


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process (every thread), or of process ``pid`` (Linux)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def convert_all(paths: list[Path], detail: str) -> tuple[float, int, int]:
    """(seconds, events, spans) converting every file as the import would, without sending."""
    base = options_from_env({}, detail=detail)
    events = spans = 0
    start = time.perf_counter()
    for source in find_sources(paths):
        result = convert_source(source, dataclasses.replace(base, run_id=source.run_id, rank=source.rank))
        events += result.stats["events_total"]
        spans += result.stats["spans"]
    return time.perf_counter() - start, events, spans


def import_all(paths: list[Path], port: int, tmp: Path, detail: str, compression: str) -> float:
    for name in [n for n in os.environ if n.startswith(("OTEL_", "OTELPROF_"))]:
        del os.environ[name]
    os.environ.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_COMPRESSION=compression,
        OTELPROF_SPOOL_DIR=str(tmp / "spool"),
    )
    args = ["-q", "import", *map(str, paths), "--detail", detail, "--ledger", str(tmp / "ledger.json"), "--no-progress"]
    start = time.perf_counter()
    code = cli_main(args)
    elapsed = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"otelprof import exited {code}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, default=[DEFAULT_PATH], metavar="PATH")
    parser.add_argument("--repeat", type=int, default=5, help="alternating runs of each; medians are reported")
    parser.add_argument("--detail", choices=("default", "full"), default="default", help="conversion detail")
    parser.add_argument("--compression", choices=("none", "gzip"), default="none", help="OTLP request compression")
    args = parser.parse_args()

    receiver = Receiver()
    files = len(find_sources(args.paths))
    converts: list[float] = []
    imports: list[float] = []
    cpu: dict[str, list[float]] = {"convert": [], "import": [], "receiver": []}
    for _ in range(args.repeat):  # alternating, so a busy moment of the machine hits both
        c0 = cpu_seconds()
        seconds, events, spans = convert_all(args.paths, args.detail)
        c1, r1 = cpu_seconds(), cpu_seconds(receiver._process.pid)
        converts.append(seconds)
        receiver.reset()
        with tempfile.TemporaryDirectory() as tmp:
            imports.append(import_all(args.paths, receiver.port, Path(tmp), args.detail, args.compression))
        cpu["convert"].append(c1 - c0)
        cpu["import"].append(cpu_seconds() - c1)
        cpu["receiver"].append(cpu_seconds(receiver._process.pid) - r1)
        got = receiver.spans()
        if got != spans:
            raise RuntimeError(f"receiver decoded {got} spans, the conversion made {spans}")
    receiver.stop()

    t_convert, t_import = statistics.median(converts), statistics.median(imports)
    convert_rate, import_rate = events / t_convert, events / t_import
    ratio = import_rate / convert_rate
    print(f"input      : {files} files, {events:,} trace events, {spans:,} spans at {args.detail} detail")
    print(f"convert    : {t_convert * 1e3:.0f} ms = {convert_rate:,.0f} events/s (conversion only, the anchor)")
    print(
        f"import     : {t_import * 1e3:.0f} ms = {import_rate:,.0f} events/s, {spans / t_import:,.0f} spans/s "
        f"(discovery, conversion, OTLP/gRPC to a local receiver, compression {args.compression}, ledger)"
    )
    c = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"cpu        : convert {c['convert']:.2f} s; import {c['import']:.2f} s in this process + "
        f"{c['receiver']:.2f} s in the receiver, on {os.cpu_count()} cores shared with whatever else runs"
    )
    cores = os.cpu_count() or 1
    floor = (c["import"] + c["receiver"]) / cores  # every core busy for the whole import
    print(
        f"cpu floor  : (import + receiver CPU) / {cores} cores = {floor * 1e3:.0f} ms: the import cannot beat it "
        f"here, so import / convert <= {t_convert / floor:.2f} on this machine whatever the overlap"
    )
    print(f"ratio      : import / convert = {ratio:.2f} (target >= 0.8: {'met' if ratio >= 0.8 else 'NOT met'})")
    print(json.dumps({"import_events_per_s": round(import_rate), "convert_events_per_s": round(convert_rate),
                      "ratio": round(ratio, 3), "met": ratio >= 0.8}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
