"""Native conversion at default detail (what `otelprof import`, `convert` and live windows run)
against a baseline build of another revision, interleaved in one run.

    python benchmarks/convert_default.py [TRACE ...] --baseline-rev REV [--repeat N]
    python benchmarks/convert_default.py [TRACE ...] --baseline PATH/_native....so [--repeat N]

--baseline-rev builds REV's native module once (a git worktree and `pip wheel`, into
~/.cache/otelprof-bench/REV) and loads it beside this checkout's; both convert the same inflated
JSON with the same options (threads=1, default detail) in balanced orders (benchmarks/orders.py).
Prints per trace the medians and the ratio this/baseline, then the ratio of the summed medians
against the issue 33 target (default detail within 10 % of the baseline's speed, <= 1.10). The
last line is JSON (figures). Without TRACEs: every shared Kineto trace.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.machinery
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.orders import balanced_orders  # noqa: E402

TARGET = 1.10
SHARED = ROOT.parent / "shared" / "traces" / "kineto"


def load_module(path: Path) -> ModuleType:
    """A ``_native`` from a given build (in a worker process of its own: two builds' pybind11
    types cannot share one process)."""
    loader = importlib.machinery.ExtensionFileLoader("_native", str(path))
    spec = importlib.util.spec_from_file_location("_native", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def worker(so: Path, options_json: str) -> None:
    """Reads a trace path per line, converts it (inflated once, kept) and answers the seconds
    the conversion took and how many requests it made. Imports nothing of otelprof, whose own
    native module would hold the pybind11 type names."""
    module = load_module(so)
    options = json.loads(options_json)
    options["resource"] = lambda *facts: ([], 0)  # the same for both sides: no Python composer
    cache: dict[str, bytes] = {}
    for line in sys.stdin:
        path = line.strip()
        if path not in cache:
            data = Path(path).read_bytes()
            cache[path] = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        t = time.perf_counter()
        out = module.convert(cache[path], options)
        elapsed = time.perf_counter() - t
        print(f"{elapsed} {len(out.requests)}", flush=True)


class Side:
    def __init__(self, so: Path, options_json: str) -> None:
        env_path = str(ROOT)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(so), "--options", options_json],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**__import__("os").environ, "PYTHONPATH": env_path},
        )

    def run(self, path: Path) -> tuple[float, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        seconds, requests = self.proc.stdout.readline().split()
        return float(seconds), int(requests)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def build_revision(rev: str) -> Path:
    """REV's native module, built once into ~/.cache/otelprof-bench/REV."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], capture_output=True, text=True, check=True)
    cache = Path.home() / ".cache" / "otelprof-bench" / sha.stdout.strip()
    found = sorted(cache.glob("_native*.so"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True)
        try:
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(Path(tmp) / "dist"), str(tree)],
                check=True,
            )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        (wheel,) = (Path(tmp) / "dist").glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            (member,) = (n for n in zf.namelist() if n.startswith("otelprof/_native") and n.endswith(".so"))
            target = cache / Path(member).name
            target.write_bytes(zf.read(member))
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--options", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=Path, help="a built _native module of another revision")
    parser.add_argument("--baseline-rev", help="a git revision to build the baseline from")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.options)
        return 0
    if (args.baseline is None) == (args.baseline_rev is None):
        parser.error("give one of --baseline or --baseline-rev")
    from otelprof import ConvertOptions
    from otelprof._native_module import native

    if native is None:
        print("the native module did not load", file=sys.stderr)
        return 2
    options = {k: v for k, v in ConvertOptions(threads=1).as_native().items() if k != "resource"}
    options_json = json.dumps(options)
    baseline = args.baseline or build_revision(args.baseline_rev)
    sides = {"this": Side(Path(native.__file__), options_json), "baseline": Side(baseline, options_json)}
    traces = args.traces or sorted(SHARED.glob("*.json.gz"))
    totals = {"this": 0.0, "baseline": 0.0}
    rows = balanced_orders(list(sides))
    try:
        for path in traces:
            requests = {name: side.run(path)[1] for name, side in sides.items()}  # warm: inflated, faulted in
            times: dict[str, list[float]] = {name: [] for name in sides}
            for r in range(args.repeat):
                for name in rows[r % len(rows)]:
                    times[name].append(sides[name].run(path)[0])
            med = {name: statistics.median(v) for name, v in times.items()}
            for name in sides:
                totals[name] += med[name]
            print(
                f"{path.name[-60:]:60} this {med['this'] * 1e3:8.2f} ms  baseline {med['baseline'] * 1e3:8.2f} ms"
                f"  ratio {med['this'] / med['baseline']:.3f}  ({requests['this']} / {requests['baseline']} requests)"
            )
    finally:
        for side in sides.values():
            side.close()
    ratio = totals["this"] / totals["baseline"]
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"summed medians: this {totals['this'] * 1e3:.1f} ms, baseline {totals['baseline'] * 1e3:.1f} ms")
    print(f"ratio this/baseline {ratio:.3f} (target <= {TARGET}: {verdict})")
    print(json.dumps({"this_ms": totals["this"] * 1e3, "baseline_ms": totals["baseline"] * 1e3, "ratio": ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
