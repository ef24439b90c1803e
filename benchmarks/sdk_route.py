"""What the trace route (otelprof/export/sdk_route.py) costs per span, on the span and conversion
threads, against otelprof's fast path, interleaved:

    python benchmarks/sdk_route.py [TRACE] [--steps N] [--rounds N]

Two loads: step spans (``--steps`` steps of 4 phases, encoded by the native step encoder as the
session does) and one profiling window's spans (TRACE converted, as a window is). Routes, each
timed over the same requests in every round, in a shuffled order:

- ``encode``/``convert``: making the requests (the fast path's whole cost: its submit is one call);
- ``fast``: ``submit`` with every trace kept and no SDK processor (the request passes untouched);
- ``sampled``: ``OTEL_TRACES_SAMPLER=traceidratio`` at 0.5 (decode, drop, encode again);
- ``sdk``: the SDK route into a processor that counts (decode, ``ReadableSpan``s, ``on_end``);
- ``sdk_batch``: the SDK route into a ``BatchSpanProcessor`` with an exporter that drops
  everything (its queue and thread are paid, no exporter's encoding).

Prints the median microseconds per span of each, and the SDK route's cost over the fast path's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from otelprof.capture.distributed.identity import Identity
from otelprof.capture.spans.step_spans import StepPhaseRecord, StepRecord, StepRecordEncoder
from otelprof.converter import ConvertOptions, convert
from otelprof.export import sampling
from otelprof.export.sdk_route import TraceRoute

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "kineto" / "hta__tests__data__nccl_parser_config__nccl_data.json.gz"


class Counting:
    """A span processor that only counts what it is handed."""

    def __init__(self) -> None:
        self.spans = 0

    def on_end(self, span: Any) -> None:
        self.spans += 1

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


class Dropping(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def step_records(steps: int) -> list[StepRecord]:
    out, t = [], 1_700_000_000_000_000_000
    for n in range(steps):
        phases = [
            StepPhaseRecord(p, t + i * 1000, t + (i + 1) * 1000, "Model" if p == "forward" else None)
            for i, p in enumerate(("data", "forward", "backward", "optimizer"))
        ]
        out.append(StepRecord("train.step", n, t, t + 4000, n * 5, None, None, 32, 4096, 0, phases, 1, None))
        t += 4000
    return out


def span_count(requests: list[bytes]) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return sum(
        len(ss.spans)
        for r in requests
        for rs in ExportTraceServiceRequest.FromString(r).resource_spans
        for ss in rs.scope_spans
    )


def routes(requests: list[bytes], make: Callable[[], list[bytes]]) -> dict[str, Callable[[], None]]:
    sent: list[bytes] = []
    ratio = sampling.from_env({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"})
    batch = BatchSpanProcessor(Dropping(), max_queue_size=1 << 20)
    by_name = {
        "fast": TraceRoute(sampling.TraceSampler(), sent.append),
        "sampled": TraceRoute(ratio, sent.append),
        "sdk": TraceRoute(sampling.TraceSampler(), None, [Counting()]),
        "sdk_batch": TraceRoute(sampling.TraceSampler(), None, [batch]),
    }

    def run(route: TraceRoute) -> Callable[[], None]:
        def go() -> None:
            sent.clear()
            ratio._decided.clear()  # each round decides afresh
            for request in requests:
                route.submit(request)
            if route.processors and route.processors[0] is batch:
                batch.force_flush()

        return go

    def made() -> None:
        make()

    return {"make": made, **{k: run(v) for k, v in by_name.items()}}


def measure(load: str, requests: list[bytes], make: Callable[[], list[bytes]], rounds: int) -> dict[str, float]:
    spans = span_count(requests)
    timed: dict[str, list[float]] = {}
    fns = routes(requests, make)
    order = list(fns)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            fns[name]()
            timed.setdefault(name, []).append((time.perf_counter() - start) / spans * 1e6)
    out = {f"{load}_{k}_us_per_span": statistics.median(v) for k, v in timed.items()}
    fast = out[f"{load}_make_us_per_span"] + out[f"{load}_fast_us_per_span"]
    out[f"{load}_sdk_over_fast"] = (out[f"{load}_make_us_per_span"] + out[f"{load}_sdk_us_per_span"]) / fast
    print(f"{load}: {spans} spans in {len(requests)} requests")
    made = "encode" if load == "steps" else "convert"
    for name, values in timed.items():
        print(f"  {made if name == 'make' else name:10s} {statistics.median(values):8.2f} us/span")
    print(f"  {made} + sdk route = {out[f'{load}_sdk_over_fast']:.1f}x {made} + fast path")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    identity = Identity(run_id="bench", rank=0, local_rank=0, world_size=1)
    encoder = StepRecordEncoder(identity, [("service.name", "bench")])
    records = step_records(args.steps)

    def encode() -> list[bytes]:
        return encoder.encode(records, 3 << 20)

    options = ConvertOptions(run_id="bench", threads=1)

    def window() -> list[bytes]:
        return list(convert(args.trace, options=options).requests)

    figures = measure("steps", encode(), encode, args.rounds)
    figures |= measure("window", window(), window, max(3, args.rounds // 2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
