"""A simulated many-rank job: every rank's step spans, profiled-window spans and metrics, made by
otelprof's real code paths (StepSpans, StepMetrics, WindowMetrics, the straggler gauge, the native
converter on a real Kineto trace), with identities rank 0..N-1 in one process — not real ranks.

    python benchmarks/distributed_scale.py [--ranks 1024] [--steps 8] [--trace PATH]

Every request is decoded (official protobuf classes) and its spans grouped by trace, as a
backend groups them. Checked against backend limits:

- Tempo ``max_bytes_per_trace`` (default 5,000,000 bytes), counted as the OTLP bytes of the
  trace's ``ResourceSpans`` (each rank's resource included);
- spans per trace under 50,000 (Tempo's former ``max_spans_per_trace`` default);
- every request under the Collector's 4 MiB OTLP/gRPC receive limit;
- every attribute value under Tempo's ``max_attribute_bytes`` (2,048).

Metrics: each rank has its own registry; the series a scrape of it returns (OpenMetrics samples,
the exporter's own included) are counted per rank, at the anchor world size (8) and at N.
Prints the figures, the ratios against the anchor, and a JSON line; exits 1 when a limit is broken.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otelprof.capture.distributed.identity import Identity
from otelprof.capture.distributed.ranks import Straggler, straggler_ratio
from otelprof.capture.metrics.step_metrics import StepMetrics
from otelprof.capture.metrics.window_metrics import WindowMetrics, summarize
from otelprof.capture.session import _resource
from otelprof.capture.spans.step_spans import StepSpans
from otelprof.capture.steps.step import PHASES, Step
from otelprof.converter import ConvertOptions, convert
from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import Exporter

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (
    ROOT.parent
    / "shared"
    / "traces"
    / "kineto"
    / "tracelens__tests__traces__h100__gaunernst_bert-small-uncased__1016001.json.gz"
)
ANCHOR_RANKS = 8
RUN_ID = "simulated-run"
TEMPO_MAX_BYTES_PER_TRACE = 5_000_000
MAX_SPANS_PER_TRACE = 50_000
OTLP_GRPC_MAX_BYTES = 4 * 1024 * 1024
MAX_ATTRIBUTE_BYTES = 2048
STEP_S = 0.2


class Sink:
    """Takes the requests an exporter would send (the exporter is not what is measured)."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []

    def submit(self, request: bytes) -> None:
        self.requests.append(request)


def _framed(size: int) -> int:
    """Bytes of a length-delimited protobuf field holding ``size`` bytes (1-byte tag)."""
    return 1 + max(1, (size.bit_length() + 6) // 7) + size


def _attr_bytes(value: AnyValue) -> int:
    return len(value.string_value.encode()) if value.HasField("string_value") else 0


class Traces:
    """Per trace id: OTLP bytes (the trace's ResourceSpans as a backend stores them) and spans."""

    def __init__(self) -> None:
        self.bytes: dict[bytes, int] = defaultdict(int)
        self.spans: dict[bytes, int] = defaultdict(int)
        self.max_request = 0
        self.max_attribute = 0
        self.requests = 0

    def add(self, request: bytes) -> None:
        self.requests += 1
        self.max_request = max(self.max_request, len(request))
        for rs in ExportTraceServiceRequest.FromString(request).resource_spans:
            resource = _framed(rs.resource.ByteSize())
            for ss in rs.scope_spans:
                scope = _framed(ss.scope.ByteSize())
                groups: dict[bytes, int] = defaultdict(int)
                for span in ss.spans:
                    groups[span.trace_id] += _framed(span.ByteSize())
                    self.spans[span.trace_id] += 1
                    for kv in span.attributes:
                        self.max_attribute = max(self.max_attribute, _attr_bytes(kv.value))
                for trace_id, spans_bytes in groups.items():
                    self.bytes[trace_id] += _framed(resource + _framed(scope + spans_bytes))


def _series(registry: CollectorRegistry, scrape: bool = False) -> int:
    """Series a scrape returns: the registry's samples, or (``scrape``) the exposition's, parsed."""
    if scrape:
        text = generate_latest(registry).decode()
        return sum(len(family.samples) for family in text_string_to_metric_families(text))
    return sum(len(family.samples) for family in registry.collect())


def _step(number: int, start_ns: int, seconds: float) -> Step:
    bounds = [start_ns + round(seconds * 1e9 * f) for f in (0, 0.1, 0.4, 0.9, 1.0)]
    phases = [(p, bounds[i], bounds[i + 1]) for i, p in enumerate(PHASES)]
    return Step(
        number,
        bounds[0],
        bounds[-1],
        phases=phases,
        phase_totals_ns={p: e - s for p, s, e in phases},
        samples=32,
        tokens=32 * 512,
    )


def simulate(world: int, steps: int, trace: Path, exporter_series: int) -> dict[str, Any]:
    """Every rank of a ``world``-rank job: ``steps`` live steps, one profiled window."""
    rng = random.Random(world)
    means = [STEP_S * (1.5 if r == world // 2 else 1 + 0.02 * rng.random()) for r in range(world)]
    traces = Traces()
    series: list[int] = []
    ratios: dict[int, float] = {}
    live_s: list[float] = []
    t0 = time.time_ns()
    for rank in range(world):
        identity = Identity(RUN_ID, rank, rank % 8, world, "OTELPROF_RUN_ID")
        sink = Sink()
        registry = CollectorRegistry()
        begin = time.perf_counter()
        metrics = StepMetrics(identity.labels(), registry)
        window_metrics = WindowMetrics(identity.labels())
        metrics.add_collector(window_metrics)
        straggler = Straggler(None, None, world, steps)
        straggler.register(identity.labels(), registry)
        spans = StepSpans(cast(Exporter, sink), identity, _resource(identity, {"OTEL_SERVICE_NAME": "sim"}))
        start = t0
        for n in range(steps):
            step = _step(n, start, means[rank])
            start = step.end_ns
            ctx = spans.context(step)
            metrics.observe(step, ctx)
            spans.add(step, ctx)
        straggler.ratio = straggler_ratio(means[rank], means)  # what the all_gather would return
        spans.close()
        live_s.append(time.perf_counter() - begin)
        options = ConvertOptions(run_id=RUN_ID, rank=rank, world_size=world)
        window = convert(trace, options=options)  # the rank's profiled window
        for request in window.requests:
            sink.submit(request)
        window_metrics.window_done("schedule", summarize(window.ops))  # top ops/kernels, GPU busy
        for request in sink.requests:
            traces.add(request)
        count = _series(registry)
        if rank == 0 and count != _series(registry, scrape=True):
            raise RuntimeError("the registry's samples and its exposition disagree")
        series.append(count + exporter_series)
        ratios[rank] = straggler.ratio or 0.0
        metrics.unregister()
    step_ids = {_step_trace(n) for n in range(steps)}
    step_bytes = max(traces.bytes[t] for t in step_ids)
    step_spans = max(traces.spans[t] for t in step_ids)
    return {
        "ranks": world,
        "requests": traces.requests,
        "traces": len(traces.bytes),
        "max_request_bytes": traces.max_request,
        "max_attribute_bytes": traces.max_attribute,
        "max_step_trace_bytes": step_bytes,
        "max_step_trace_spans": step_spans,
        "max_trace_bytes": max(traces.bytes.values()),
        "max_trace_spans": max(traces.spans.values()),
        "unsplit_step_trace_bytes": sum(traces.bytes.values()),  # everything in the step traces
        "series_per_rank": sorted(set(series)),  # one value: every rank exposes the same number
        "series_total": sum(series),
        "live_ms_per_rank": statistics.median(live_s) * 1e3,  # median: robust to a GC pause
        "straggler_max": max(ratios.values()),
        "straggler_slowest_rank": max(ratios, key=lambda r: ratios[r]),
    }


def _step_trace(n: int) -> bytes:
    from otelprof.otlp import ids

    return ids.trace_id(f"step|{RUN_ID}|{n}")


def exporter_series() -> int:
    """Series of the exporter's own health metrics (one exporter per process)."""
    registry = CollectorRegistry()
    with tempfile.TemporaryDirectory() as spool:
        exporter = Exporter(exporter_config_from_env({}), spool_dir=Path(spool), registry=registry)
        count = _series(registry, scrape=True)
        exporter.shutdown()
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=8, help="live steps per rank (the trace's step among them)")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="the Kineto trace each rank's window records")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        print(f"error: trace not found: {args.trace}", file=sys.stderr)
        return 1
    exp = exporter_series()
    big = simulate(args.ranks, args.steps, args.trace, exp)
    anchor = simulate(min(ANCHOR_RANKS, args.ranks), args.steps, args.trace, exp)  # second: both run warm
    for r in (anchor, big):
        print(
            f"{r['ranks']:>5} ranks: step trace {r['max_step_trace_bytes']:,} B / {r['max_step_trace_spans']:,} spans, "
            f"largest trace {r['max_trace_bytes']:,} B / {r['max_trace_spans']:,} spans, "
            f"largest request {r['max_request_bytes']:,} B, {r['requests']:,} requests, {r['traces']:,} traces; "
            f"series per rank {r['series_per_rank']}, total {r['series_total']:,}; "
            f"live spans+metrics {r['live_ms_per_rank']:.2f} ms per rank ({args.steps} steps)"
        )
    print(f"unsplit     : one step trace holding every rank's window would be {big['unsplit_step_trace_bytes']:,} B")
    print(
        f"ratio       : per-rank series {big['series_per_rank'][0] / anchor['series_per_rank'][0]:.2f}x, "
        f"per-rank live cost {big['live_ms_per_rank'] / anchor['live_ms_per_rank']:.2f}x "
        f"({big['ranks']} vs {anchor['ranks']} ranks)"
    )
    limits = {
        "max_trace_bytes": TEMPO_MAX_BYTES_PER_TRACE,
        "max_trace_spans": MAX_SPANS_PER_TRACE,
        "max_request_bytes": OTLP_GRPC_MAX_BYTES,
        "max_attribute_bytes": MAX_ATTRIBUTE_BYTES,
    }
    broken = [f"{k} {big[k]:,} > {v:,}" for k, v in limits.items() if big[k] > v]
    print(
        "limits      : "
        + ("; ".join(broken) if broken else "all met (" + ", ".join(f"{k} <= {v:,}" for k, v in limits.items()) + ")")
    )
    print(json.dumps({"anchor": anchor, "scaled": big}))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
