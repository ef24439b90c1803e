"""``otelprof spool ls|replay|drop``: look at, send, or discard requests waiting in the spool."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .export.config import exporter_config_from_env
from .export.exporter import spool_dir_from_env, transport
from .export.spool import Spool


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    epilog: str,
    add_verbosity: Callable[[argparse.ArgumentParser], None],
) -> None:
    spool = sub.add_parser(
        "spool",
        help="list, replay or drop export requests waiting in the spool",
        description="Requests wait in the spool while the OTLP backend is unreachable, or when no\n"
        "endpoint is configured. The exporter replays them by itself once the backend answers.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity(spool)
    spool.add_argument(
        "--dir", type=Path, metavar="DIR", help="spool folder (default: $OTELPROF_SPOOL_DIR or ~/.cache/otelprof/spool)"
    )
    actions = spool.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("ls", help="one line per waiting request: name, bytes, spans").set_defaults(func=_ls)
    replay = actions.add_parser("replay", help="send the waiting requests, oldest first, removing each one sent")
    replay.add_argument("--endpoint", help="OTLP endpoint (default: $OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)")
    replay.add_argument("--protocol", choices=("grpc", "http/protobuf"), help="default: $OTEL_EXPORTER_OTLP_PROTOCOL")
    replay.set_defaults(func=_replay)
    actions.add_parser("drop", help="delete every waiting request").set_defaults(func=_drop)


def _spool(args: argparse.Namespace) -> Spool:
    return Spool(args.dir or spool_dir_from_env())


def _info(args: argparse.Namespace, line: str) -> None:
    if not args.quiet:
        print(line, file=sys.stderr)


def _spans(data: bytes) -> int | None:
    try:
        request = ExportTraceServiceRequest.FromString(data)
    except DecodeError:
        return None
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def _ls(args: argparse.Namespace) -> int:
    spool = _spool(args)
    total_bytes = total_spans = 0
    for record, data in spool:
        spans = _spans(data)
        total_bytes += len(data)
        total_spans += spans or 0
        print(f"{record.name}\t{len(data)} bytes\t{'unreadable' if spans is None else f'{spans} spans'}")
    _info(args, f"{len(spool.records())} requests, {total_spans} spans, {total_bytes} bytes in {spool.directory}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.endpoint:  # a base endpoint, like OTEL_EXPORTER_OTLP_ENDPOINT (HTTP appends v1/traces)
        env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = args.endpoint
    if args.protocol:
        env.pop("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", None)
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = args.protocol
    cfg = exporter_config_from_env(env)
    if not cfg.endpoint_configured:
        print("otelprof: error: no endpoint: pass --endpoint or set OTEL_EXPORTER_OTLP_ENDPOINT", file=sys.stderr)
        return 1
    spool, sent = _spool(args), 0
    with spool.replay_lock() as mine:
        if not mine:
            print(f"otelprof: error: another process is replaying {spool.directory}; try later", file=sys.stderr)
            return 1
        send, close = transport(cfg)
        try:
            for record, data in spool:
                result = send(data)
                if not result.ok:  # keep it: the user decides (drop) or retries later
                    print(f"otelprof: error: {record.name}: {result.message}; {sent} sent, stopping", file=sys.stderr)
                    return 1
                spool.remove(record)
                sent += 1
        finally:
            close()
    _info(args, f"{sent} requests sent to {cfg.url}")
    return 0


def _drop(args: argparse.Namespace) -> int:
    spool = _spool(args)
    records = spool.records()
    for record in records:
        spool.remove(record)
    _info(args, f"{len(records)} requests dropped from {spool.directory}")
    return 0
