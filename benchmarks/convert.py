"""Native conversion throughput and memory on every shared Kineto trace (or the TRACEs given),
against the issue 18 targets, measured in one run.

    python benchmarks/convert.py [TRACE ...] [--repeat N] [--sdk-spans N] [--large-mb MB] [--reference]

Per trace, at detail="full", the medians of N interleaved runs (in balanced orders: each kind
as often straight after each other kind, benchmarks/orders.py) of
- bytes: ``_native.convert`` of the already-inflated JSON on one thread (spans/s, MB/s of JSON):
         the targets are per core, as the SDK path runs;
- 2 thr: the same with ``threads=2`` (ConvertOptions' default, TraceReader::split: a second
         thread parses the second half of 8 MiB of JSON or more), for the record;
- gz:    ``convert(path)`` with ``threads=1``, as bytes: it reads the file and inflates it in
         the native core, on a thread of its own as always, while the parser reads (spans/s, MB/s
         of inflated JSON, slowdown against bytes; at the default threads=2 its build and encode
         would share a second thread, and bytes on one thread would not be its peer);
- sdk:   the OpenTelemetry SDK path (TracerProvider + OTLP encoder) on --sdk-spans spans of
         the largest trace, its N runs interleaved with that trace's, against bytes there;
- RSS:   a fresh child process converting the file from its path: its RSS after imports
         (base) and its peak (VmHWM, reset at exec, unlike ru_maxrss which reports the parent's
         peak after fork+exec), against the OTLP payload (sum of request bytes).
Targets, on the large traces (inflated JSON >= --large-mb; all traces if none is): bytes
>= 1,000,000 spans/s and >= 500 MB/s (totals); gz <= 25% slower than bytes (totals); >= 100x the
SDK path (largest trace); peak RSS <= 3x payload (every large trace). The last line is JSON (figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks.orders, when run as a script

from benchmarks.orders import balanced_orders  # noqa: E402
from otelprof import _native  # noqa: E402
from otelprof.converter import ConvertOptions, convert, convert_bytes, load_bytes  # noqa: E402

DEFAULT_DIR = ROOT.parent / "shared" / "traces" / "kineto"
MiB = 1024 * 1024

#: Runs in a fresh interpreter: RSS after imports, then the peak of converting argv[1].
CHILD = """
import json, sys
from otelprof.converter import convert
def status():
    return {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in open("/proc/self/status"))
            if k in ("VmRSS", "VmHWM")}
base = status()["VmRSS"]
payload = sum(map(len, convert(sys.argv[1], detail="full", engine="native").requests))
print(json.dumps({"base": base, "peak": status()["VmHWM"], "payload": payload}))
"""


def child_rss(trace: Path) -> dict[str, int]:
    """Bytes: the child's RSS after imports (base), its peak (peak), the OTLP payload (payload)."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(trace)], check=True, capture_output=True, text=True)
    figures: dict[str, int] = json.loads(out.stdout)
    return figures


def timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def sdk_sample(requests: list[bytes], limit: int) -> list[tuple[str, bytes, bytes, int, int, dict[str, object]]]:
    """The first ``limit`` spans of the native requests: (name, trace id, parent id, start, end, attributes)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    def value(v: object) -> object:
        kind = v.WhichOneof("value") or "string_value"  # type: ignore[attr-defined]
        inner = getattr(v, kind)
        return [value(x) for x in inner.values] if kind == "array_value" else inner

    out: list[tuple[str, bytes, bytes, int, int, dict[str, object]]] = []
    for data in requests:
        for rs in ExportTraceServiceRequest.FromString(data).resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {kv.key: value(kv.value) for kv in s.attributes}
                    out.append(
                        (s.name, s.trace_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano, attrs)
                    )
                    if len(out) == limit:
                        return out
    return out


def sdk_run(spans: list[tuple[str, bytes, bytes, int, int, dict[str, object]]]) -> float:
    """Seconds to create the spans through the SDK (explicit timestamps, parents, attributes) and encode them."""
    from opentelemetry import trace as api
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otelprof-bench")
    start = time.perf_counter()
    for name, trace_id, parent_id, t0, t1, attrs in spans:
        ctx = None
        if parent_id:
            flags = api.TraceFlags(api.TraceFlags.SAMPLED)
            parent = api.SpanContext(int.from_bytes(trace_id, "big"), int.from_bytes(parent_id, "big"), False, flags)
            ctx = api.set_span_in_context(api.NonRecordingSpan(parent))
        tracer.start_span(name, context=ctx, start_time=t0, attributes=attrs).end(end_time=t1)  # type: ignore[arg-type]
    finished = exporter.get_finished_spans()
    encoded = encode_spans(finished).SerializeToString()
    elapsed = time.perf_counter() - start
    if len(finished) != len(spans) or not encoded:
        raise RuntimeError(f"SDK path recorded {len(finished)} of {len(spans)} spans")
    return elapsed


#: Path words of the shared traces' names (``hta__tests__data__...``) that tell no trace apart.
GENERIC = {"hta", "kineto", "tracelens", "param", "tests", "data", "traces", "tb_plugin", "samples", "et_replay"}


def short(path: Path, width: int = 34) -> str:
    """The file name without generic path words and suffixes, cut in the middle to ``width``."""
    parts = path.name.removesuffix(".gz").removesuffix(".json").removesuffix(".pt.trace").split("__")
    while len(parts) > 1 and parts[0] in GENERIC | {"inputs"}:
        parts.pop(0)
    name = "/".join(parts)
    half = (width - 1) // 2
    return name if len(name) <= width else f"{name[:half]}…{name[-(width - 1 - half) :]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path, default=[DEFAULT_DIR], metavar="TRACE", help="file or folder")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs of each; medians are reported")
    parser.add_argument("--sdk-spans", type=int, default=20000, help="spans pushed through the SDK path")
    parser.add_argument("--large-mb", type=float, default=10.0, help="traces judged against the targets (MB JSON)")
    parser.add_argument("--reference", action="store_true", help="also time the Python reference engine (slow)")
    args = parser.parse_args()

    paths = sorted(
        (q for p in args.traces for q in (sorted(p.glob("*.json*")) if p.is_dir() else [p])),
        key=lambda q: q.stat().st_size,
    )
    opts = ConvertOptions(detail="full", threads=1)
    native_opts = opts.as_native()
    two_threads = {**opts.as_native(), "threads": 2}

    print(f"{'trace':<34} {'JSON MB':>7} {'spans':>8} | {'bytes spans/s':>13} {'MB/s':>5} {'2 thr':>9} | "
          f"{'gz spans/s':>10} {'MB/s':>5} {'slower':>6} | "
          f"{'payload MiB':>11} {'RSS base':>8} {'peak':>5} {'/payload':>8}")  # fmt: skip
    rows, t_sdk, sample = [], [], []
    for path in paths:
        data, _ = load_bytes(path)
        out = _native.convert(data, native_opts)
        if path == paths[-1]:  # the SDK path runs on the largest trace's spans, interleaved with it
            sample = sdk_sample(list(out.requests), args.sdk_spans)
        t_bytes, t_two, t_gz = [], [], []
        orders = balanced_orders(["bytes", "two", "gz", "sdk"] if sample else ["bytes", "two", "gz"])
        # Interleaved, so a busy moment hits each; in balanced orders, so none always runs
        # straight after the same other. Right after the SDK path's second of pure Python, the
        # largest trace converts ~20 % (up to 70 %) slower here (this VM hands memory freed for
        # ~1 s back to its host, and faulting it in again costs ~10x): the rotated order used
        # before kept "bytes" straight after the SDK path, and charged that to it alone.
        for k in range(args.repeat):
            for kind in orders[k % len(orders)]:
                if kind == "bytes":
                    t_bytes.append(timed(_native.convert, data, native_opts))
                elif kind == "two":
                    t_two.append(timed(_native.convert, data, two_threads))
                elif kind == "gz":
                    t_gz.append(timed(convert, path, options=opts, engine="native"))
                else:
                    t_sdk.append(sdk_run(sample))
        row = {"mb": len(data) / 1e6, "spans": out.stats["spans"], "tb": statistics.median(t_bytes)}
        row["t2"] = statistics.median(t_two)
        row |= {"tg": statistics.median(t_gz), **child_rss(path)}
        rows.append(row)
        spans, mb, tb, tg = row["spans"], row["mb"], row["tb"], row["tg"]
        ref = ""
        if args.reference:
            ref = f" | reference {spans / timed(convert_bytes, data, opts, engine='reference'):,.0f} spans/s"
        two = spans / row["t2"]
        print(f"{short(path):<34} {mb:7.1f} {spans:8,} | {spans / tb:13,.0f} {mb / tb:5.0f} {two:9,.0f} | "
              f"{spans / tg:10,.0f} {mb / tg:5.0f} {(tg / tb - 1) * 100:5.0f}% | "
              f"{row['payload'] / MiB:11.1f} {row['base'] / MiB:8.0f} {row['peak'] / MiB:5.0f} "
              f"{row['peak'] / max(row['payload'], 1):7.1f}x{ref}", flush=True)  # fmt: skip
    sdk_rate = len(sample) / statistics.median(t_sdk)
    native_rate = rows[-1]["spans"] / rows[-1]["tb"]
    two_rate = rows[-1]["spans"] / rows[-1]["t2"]
    print(
        f"sdk path   : {sdk_rate:,.0f} spans/s ({len(sample):,} spans of {short(paths[-1])}, TracerProvider + OTLP "
        f"encoder, interleaved with that trace's runs); native from bytes there {native_rate / sdk_rate:.0f}x as fast "
        f"on one thread, {two_rate / sdk_rate:.0f}x on two"
    )

    large = [r for r in rows if r["mb"] >= args.large_mb] or rows
    spans, mb = sum(r["spans"] for r in large), sum(r["mb"] for r in large)
    tb, tg, t2 = sum(r["tb"] for r in large), sum(r["tg"] for r in large), sum(r["t2"] for r in large)
    worst_rss = max(r["peak"] / max(r["payload"], 1) for r in large)
    figures = {
        "traces": len(rows),
        "large_traces": len(large),
        "bytes_spans_per_s": round(spans / tb),
        "bytes_mb_per_s": round(mb / tb, 1),
        "two_threads_spans_per_s": round(spans / t2),
        "two_threads_speedup": round(tb / t2, 2),
        "gz_spans_per_s": round(spans / tg),
        "gz_mb_per_s": round(mb / tg, 1),
        "gz_slowdown_pct": round((tg / tb - 1) * 100, 1),
        "sdk_spans_per_s": round(sdk_rate),
        "native_over_sdk": round(native_rate / sdk_rate, 1),
        "two_threads_over_sdk": round(two_rate / sdk_rate, 1),
        "peak_rss_mib": round(max(r["peak"] for r in large) / MiB, 1),
        "base_rss_mib": round(max(r["base"] for r in large) / MiB, 1),
        "peak_over_payload": round(worst_rss, 2),
    }
    which = (
        f"{len(large)} traces >= {args.large_mb:g} MB"
        if large[0]["mb"] >= args.large_mb
        else f"all {len(rows)} traces (none >= {args.large_mb:g} MB)"
    )
    print(
        f"large      : {which}: {spans:,} spans, {mb:.1f} MB JSON; bytes {tb * 1e3:.0f} ms, "
        f"two threads {t2 * 1e3:.0f} ms ({tb / t2:.2f}x), gz {tg * 1e3:.0f} ms"
    )

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    f = figures
    print(
        f"targets    : bytes >= 1,000,000 spans/s ({f['bytes_spans_per_s']:,}): {verdict(spans / tb >= 1e6)}; "
        f"bytes >= 500 MB/s ({f['bytes_mb_per_s']:.0f}): {verdict(mb / tb >= 500)}; "
        f"gz <= 25% slower ({f['gz_slowdown_pct']:.0f}%): {verdict(tg <= 1.25 * tb)}; "
        f">= 100x SDK ({f['native_over_sdk']:.0f}x): {verdict(native_rate >= 100 * sdk_rate)}; "
        f"peak RSS <= 3x payload (worst {worst_rss:.1f}x): {verdict(worst_rss <= 3)}"
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
