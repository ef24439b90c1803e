"""Export throughput to a local OTLP/gRPC receiver: otelprof (the native core's request bytes,
through the background Exporter) vs the OpenTelemetry SDK's ``OTLPSpanExporter`` (the same
spans as SDK ``ReadableSpan`` objects), measured in one run.

    python benchmarks/export.py [TRACE] [--sdk-spans N] [--repeat N]

The receiver is the official OTLP ``TraceService`` in a separate process (so it does not share
our GIL); it decodes every request with the official protobuf classes and reports the span
count, which must equal what was sent. Prints spans/s and MB/s for each path and the ratio.
Target (issue 3): otelprof >= 20x the SDK path end to end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import cast

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.util.types import AttributeValue

from otelprof.converter import convert
from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import Exporter

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (
    ROOT.parent / "shared" / "traces" / "kineto" / "hta__tests__data__df_index_resolver__df_index_resolver.json.gz"
)
SDK_BATCH = 512  # BatchSpanProcessor's default max_export_batch_size


def receiver_main(conn: Connection) -> None:
    """A gRPC OTLP receiver counting decoded spans; answers 'count' with the running total."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    totals = {"spans": 0, "requests": 0}

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: ExportTraceServiceRequest, context: object) -> ExportTraceServiceResponse:
            totals["spans"] += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            totals["requests"] += 1
            return ExportTraceServiceResponse()

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=1), options=[("grpc.max_receive_message_length", 64 << 20)]
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    conn.send(port)
    while (command := conn.recv()) != "stop":
        if command == "reset":
            totals.update(spans=0, requests=0)
        conn.send(dict(totals))
    server.stop(grace=None)


class Receiver:
    """receiver_main in a spawned process (so it does not share the measured process's GIL)."""

    def __init__(self) -> None:
        self._conn, child = mp.Pipe()
        self._process = mp.get_context("spawn").Process(target=receiver_main, args=(child,), daemon=True)
        self._process.start()
        self.port: int = self._conn.recv()

    def spans(self) -> int:
        """Spans decoded since the last reset."""
        self._conn.send("count")
        return cast(dict[str, int], self._conn.recv())["spans"]

    def reset(self) -> None:
        self._conn.send("reset")
        self._conn.recv()

    def stop(self) -> None:
        self._conn.send("stop")
        self._process.join(10)


def sdk_spans(requests: Sequence[bytes]) -> list:  # list[ReadableSpan]
    """The very spans otelprof sent, rebuilt as SDK ReadableSpans (ids, parents, times, attributes,
    events, links, resource), so both paths ship the same content."""
    from opentelemetry import trace as api
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    def value(v: AnyValue) -> AttributeValue:
        kind = v.WhichOneof("value") or "string_value"
        if kind == "array_value":
            return cast(AttributeValue, [value(x) for x in v.array_value.values])
        return cast(AttributeValue, getattr(v, kind))

    def context(trace_id: bytes, span_id: bytes) -> api.SpanContext:
        return api.SpanContext(int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"), False)

    out = []
    for data in requests:
        for rs in ExportTraceServiceRequest.FromString(data).resource_spans:
            resource = Resource({kv.key: value(kv.value) for kv in rs.resource.attributes})
            for ss in rs.scope_spans:
                scope = InstrumentationScope(ss.scope.name, ss.scope.version)
                for s in ss.spans:
                    out.append(
                        ReadableSpan(
                            name=s.name,
                            context=context(s.trace_id, s.span_id),
                            parent=context(s.trace_id, s.parent_span_id) if s.parent_span_id else None,
                            resource=resource,
                            attributes={kv.key: value(kv.value) for kv in s.attributes},
                            events=[
                                Event(e.name, {kv.key: value(kv.value) for kv in e.attributes}, e.time_unix_nano)
                                for e in s.events
                            ],
                            links=[
                                api.Link(
                                    context(link.trace_id, link.span_id),
                                    {kv.key: value(kv.value) for kv in link.attributes},
                                )
                                for link in s.links
                            ],
                            kind=api.SpanKind(s.kind - 1) if s.kind else api.SpanKind.INTERNAL,
                            start_time=s.start_time_unix_nano,
                            end_time=s.end_time_unix_nano,
                            instrumentation_scope=scope,
                        )
                    )
    return out


def otelprof_run(requests: Sequence[bytes], port: int, tmp: Path) -> float:
    config = exporter_config_from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    exporter = Exporter(config, spool_dir=tmp)
    exporter.submit(b"")  # connect first, as a long-running job would have (an empty request is valid)
    exporter.flush(30)
    start = time.perf_counter()
    for r in requests:
        exporter.submit(r)
    if not exporter.flush(120):
        raise RuntimeError("otelprof exporter did not finish")
    elapsed = time.perf_counter() - start
    exporter.shutdown()
    if exporter.counters.requests_exported != len(requests) + 1:
        raise RuntimeError(f"otelprof exported {exporter.counters}")
    return elapsed


def sdk_run(spans: list, port: int, batch: int) -> float:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
    exporter.export(spans[:1])  # connect first
    start = time.perf_counter()
    for i in range(0, len(spans), batch):
        if exporter.export(spans[i : i + batch]) is not SpanExportResult.SUCCESS:
            raise RuntimeError("SDK export failed")
    elapsed = time.perf_counter() - start
    exporter.shutdown()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--sdk-spans", type=int, default=30000, help="spans pushed through the SDK exporter")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each path; the best is reported")
    args = parser.parse_args()

    requests = convert(args.trace, detail="full").requests
    total_spans = sum(
        len(ss.spans)
        for r in requests
        for rs in ExportTraceServiceRequest.FromString(r).resource_spans
        for ss in rs.scope_spans
    )
    total_mb = sum(map(len, requests)) / 1e6
    print(f"trace: {args.trace.name}: {total_spans:,} spans in {len(requests)} requests, {total_mb:.1f} MB")

    receiver = Receiver()
    port = receiver.port

    import tempfile

    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        best = float("inf")
        for _ in range(args.repeat):
            best = min(best, otelprof_run(requests, port, Path(tmp)))
            got = receiver.spans()
            if got != total_spans:
                raise RuntimeError(f"receiver decoded {got} spans, sent {total_spans}")
            receiver.reset()
        results["otelprof"] = total_spans / best
        print(
            f"otelprof   : {total_spans:,} spans in {best * 1e3:.0f} ms = {total_spans / best:,.0f} spans/s, "
            f"{total_mb / best:,.0f} MB/s (request bytes from the native core, background Exporter)"
        )

    spans = sdk_spans(requests)[: args.sdk_spans]
    for label, batch in (("sdk", SDK_BATCH), ("sdk-big", 0)):
        size = batch or max(1, total_spans // len(requests))  # our requests' size, in spans
        best = float("inf")
        for _ in range(args.repeat):
            receiver.reset()
            best = min(best, sdk_run(spans, port, size))
            got = receiver.spans()
            if got != len(spans) + 1:
                raise RuntimeError(f"receiver decoded {got} spans, sent {len(spans) + 1}")
        results[label] = len(spans) / best
        mb = total_mb * len(spans) / total_spans
        print(
            f"{label:<11}: {len(spans):,} spans in {best * 1e3:.0f} ms = {len(spans) / best:,.0f} spans/s, "
            f"{mb / best:,.1f} MB/s (OTLPSpanExporter, {size} spans per export)"
        )
    receiver.stop()

    best_sdk = max(results["sdk"], results["sdk-big"])
    ratio = results["otelprof"] / best_sdk
    print(f"ratio      : otelprof / best SDK = {ratio:.1f}x (target 20x: {'met' if ratio >= 20 else 'NOT met'})")
    print(json.dumps({k + "_spans_per_s": round(v) for k, v in results.items()} | {"ratio": round(ratio, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
