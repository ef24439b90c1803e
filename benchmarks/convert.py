"""Conversion throughput on the largest shared trace: native core vs Python reference vs the
OpenTelemetry SDK path, measured in one run so the ratios compare like with like.

    python benchmarks/convert.py [TRACE] [--repeat N] [--sdk-spans N]

Prints spans/s for each engine, the ratios, and the native run's peak RSS (measured in a child
process so the reference and SDK runs do not inflate it). Target (issue 2): native >= 1,000,000
spans/s on one core and >= 50x the SDK path.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from otelprof.converter import ConvertOptions, convert_bytes, load_bytes
from otelprof.converter.reference import builder as ref_builder
from otelprof.converter.reference import reader as ref_reader

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (
    ROOT.parent / "shared" / "traces" / "kineto" / "hta__tests__data__df_index_resolver__df_index_resolver.json.gz"
)


def native_run(data: bytes | bytearray, repeat: int) -> dict[str, float]:
    from otelprof import _native

    opts = ConvertOptions(detail="full").as_native()
    best: dict[str, float] = {}
    for _ in range(repeat):
        start = time.perf_counter()
        out = _native.convert(data, opts)
        wall = time.perf_counter() - start
        if not best or wall < best["wall_s"]:
            best = {"wall_s": wall, "spans": out.stats["spans"], **{k: v / 1e9 for k, v in out.phases.items()}}
    return best


def sdk_run(data: bytes | bytearray, limit: int) -> tuple[int, float]:
    """Create the same spans through the SDK (explicit timestamps, parents, attributes) and encode them."""
    from opentelemetry import trace as api
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    built = ref_builder.build(ref_reader.read(data), ConvertOptions(detail="full"))
    spans = built.spans[:limit]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otelprof-bench")
    start = time.perf_counter()
    for sp in spans:
        ctx = None
        if sp.parent_id:
            parent = api.SpanContext(
                int.from_bytes(sp.trace_id, "big"),
                int.from_bytes(sp.parent_id, "big"),
                False,
                api.TraceFlags(api.TraceFlags.SAMPLED),
            )
            ctx = api.set_span_in_context(api.NonRecordingSpan(parent))
        span = tracer.start_span(sp.name, context=ctx, start_time=sp.start, attributes=dict(sp.attrs))
        span.end(end_time=sp.end)
    finished = exporter.get_finished_spans()
    encoded = encode_spans(finished).SerializeToString()
    elapsed = time.perf_counter() - start
    if len(finished) != len(spans) or not encoded:
        raise RuntimeError(f"SDK path recorded {len(finished)} of {len(spans)} spans")
    return len(spans), elapsed


def child_peak_rss(trace: Path) -> float:
    """Peak RSS (MiB) of a fresh process that loads the trace and converts it natively once."""
    code = (
        "import resource,sys,json;from otelprof.converter import convert;"
        f"r=convert({str(trace)!r},detail='full',engine='native');"
        "print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return int(out.strip()) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--repeat", type=int, default=5, help="native runs; the best is reported")
    parser.add_argument("--sdk-spans", type=int, default=20000, help="spans pushed through the SDK path")
    args = parser.parse_args()

    data, _ = load_bytes(args.trace)
    print(f"trace: {args.trace.name} ({len(data) / 1e6:.1f} MB JSON)")

    nat = native_run(data, args.repeat)
    native_rate = nat["spans"] / nat["wall_s"]
    span_work = nat["build"] + nat["encode"]
    print(
        f"native     : {nat['spans']:,} spans in {nat['wall_s'] * 1e3:.0f} ms = {native_rate:,.0f} spans/s end to end "
        f"(parse + read events {nat['parse'] * 1e3:.0f} ms, metadata {nat['read'] * 1e3:.0f} ms, "
        f"build {nat['build'] * 1e3:.0f} ms, "
        f"encode {nat['encode'] * 1e3:.0f} ms; build + encode alone: {nat['spans'] / span_work:,.0f} spans/s)"
    )

    start = time.perf_counter()
    ref = convert_bytes(data, ConvertOptions(detail="full"), engine="reference")
    ref_s = time.perf_counter() - start
    ref_rate = ref.stats["spans"] / ref_s
    print(f"reference  : {ref.stats['spans']:,} spans in {ref_s:.2f} s = {ref_rate:,.0f} spans/s")

    n_sdk, sdk_s = sdk_run(data, args.sdk_spans)
    sdk_rate = n_sdk / sdk_s
    print(f"sdk        : {n_sdk:,} spans in {sdk_s:.2f} s = {sdk_rate:,.0f} spans/s (TracerProvider + OTLP encoder)")

    rss = child_peak_rss(args.trace)
    print(f"ratios     : native/reference = {native_rate / ref_rate:.1f}x, native/sdk = {native_rate / sdk_rate:.1f}x")
    print(f"peak RSS   : {rss:.0f} MiB (fresh process, native conversion of this trace)")
    met_rate = "met" if native_rate >= 1e6 else "NOT met"
    met_ratio = "met" if native_rate >= 50 * sdk_rate else "NOT met"
    print(f"targets    : native >= 1,000,000 spans/s: {met_rate}; native >= 50x sdk: {met_ratio}")
    print(
        json.dumps(
            {
                "native_spans_per_s": round(native_rate),
                "reference_spans_per_s": round(ref_rate),
                "sdk_spans_per_s": round(sdk_rate),
                "native_peak_rss_mib": round(rss),
                "this_process_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
