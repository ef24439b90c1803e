"""End-to-end ``otelprof import`` throughput: every shared Kineto trace (or the PATHs given)
imported to a local OTLP/gRPC receiver, against plain conversion of the same files measured
in the same run (the anchor: what the import costs beyond converting).

    python benchmarks/import.py [PATH ...] [--repeat N]

The import runs as the CLI does (discovery, conversion, batches through the background
Exporter, ledger writes, final flush); the receiver, in a separate process so it does not share
our GIL, decodes every request and must report exactly the spans the conversion produced.
Prints events/s (input trace events, as the progress line counts them) for both and the ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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


def convert_all(paths: list[Path]) -> tuple[float, int, int]:
    """(seconds, events, spans) converting every file as the import would, without sending."""
    base = options_from_env({})
    events = spans = 0
    start = time.perf_counter()
    for source in find_sources(paths):
        result = convert_source(source, dataclasses.replace(base, run_id=source.run_id, rank=source.rank))
        events += result.stats["events_total"]
        spans += result.stats["spans"]
    return time.perf_counter() - start, events, spans


def import_all(paths: list[Path], port: int, tmp: Path) -> float:
    for name in [n for n in os.environ if n.startswith(("OTEL_", "OTELPROF_"))]:
        del os.environ[name]
    os.environ.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTELPROF_SPOOL_DIR=str(tmp / "spool"),
    )
    start = time.perf_counter()
    code = cli_main(["-q", "import", *map(str, paths), "--ledger", str(tmp / "ledger.json"), "--no-progress"])
    elapsed = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"otelprof import exited {code}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, default=[DEFAULT_PATH], metavar="PATH")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best is reported")
    args = parser.parse_args()

    receiver = Receiver()
    files = len(find_sources(args.paths))
    best_convert, events, spans = min(convert_all(args.paths) for _ in range(args.repeat))
    best_import = float("inf")
    for _ in range(args.repeat):
        receiver.reset()
        with tempfile.TemporaryDirectory() as tmp:
            best_import = min(best_import, import_all(args.paths, receiver.port, Path(tmp)))
        got = receiver.spans()
        if got != spans:
            raise RuntimeError(f"receiver decoded {got} spans, the conversion made {spans}")
    receiver.stop()

    convert_rate, import_rate = events / best_convert, events / best_import
    ratio = import_rate / convert_rate
    print(f"input      : {files} files, {events:,} trace events, {spans:,} spans at default detail")
    print(f"convert    : {best_convert * 1e3:.0f} ms = {convert_rate:,.0f} events/s (conversion only, the anchor)")
    print(
        f"import     : {best_import * 1e3:.0f} ms = {import_rate:,.0f} events/s, {spans / best_import:,.0f} spans/s "
        "(discovery, conversion, OTLP/gRPC to a local receiver, ledger)"
    )
    print(f"ratio      : import / convert = {ratio:.2f}")
    print(json.dumps({"import_events_per_s": round(import_rate), "convert_events_per_s": round(convert_rate),
                      "ratio": round(ratio, 3)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
