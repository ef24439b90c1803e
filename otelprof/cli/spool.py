"""``otelprof spool ls|replay|drop``: look at, send, or discard requests waiting in the spool.

Each record names the destination it was spooled for (a digest of endpoint, protocol and
headers: ``export/destination.py``). ``replay`` sends only the records of the destination it is
given (``--endpoint``/``--protocol``, else ``OTEL_EXPORTER_OTLP_*``), plus those that name none
(spooled with no endpoint set, or by an otelprof older than destinations); records of another
destination go there only when named explicitly with ``--destination``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

# The exporter (grpc, prometheus-client), the settings tables and protobuf's message classes
# are imported when an action runs, not when the parser is built (every ``otelprof`` command
# line builds it).
if TYPE_CHECKING:
    from ..export.spool import Spool

#: How ``ls`` names the records written before destinations existed.
UNKNOWN = "unknown"


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    epilog: str,
    add_verbosity: Callable[[argparse.ArgumentParser], None],
) -> None:
    spool = sub.add_parser(
        "spool",
        help="list, replay or drop export requests waiting in the spool",
        description="Requests wait in the spool while the OTLP backend is unreachable, or when no\n"
        "endpoint is configured. A job's exporter replays, once the backend answers, the requests\n"
        "spooled for its own destination (endpoint, protocol, headers); `replay` sends the others.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity(spool)
    spool.add_argument(
        "--dir", type=Path, metavar="DIR", help="spool folder (default: $OTELPROF_SPOOL_DIR or ~/.cache/otelprof/spool)"
    )
    actions = spool.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = actions.add_parser(
        "ls", help="one line per waiting request: name, bytes, spans, destination; then the destinations"
    )
    add_verbosity(ls)  # -q/-v after every command name, as everywhere
    ls.set_defaults(func=_ls)
    replay = actions.add_parser(
        "replay",
        help="send the waiting requests of this destination (and those naming none), oldest first, "
        "removing each one sent",
    )
    add_verbosity(replay)
    replay.add_argument("--endpoint", help="OTLP endpoint (default: $OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)")
    replay.add_argument("--protocol", choices=("grpc", "http/protobuf"), help="default: $OTEL_EXPORTER_OTLP_PROTOCOL")
    replay.add_argument(
        "--destination",
        action="append",
        default=[],
        metavar="ID",
        help="also send the requests spooled for destination ID (from `ls`; `all`: every one) to this "
        "endpoint; repeatable",
    )
    replay.set_defaults(func=_replay)
    drop = actions.add_parser("drop", help="delete every waiting request")
    add_verbosity(drop)
    drop.set_defaults(func=_drop)


def _spool(args: argparse.Namespace) -> Spool:
    """``CliError`` (one line, exit 1) for a folder that is not private: its records may have
    been planted by someone else, and replay would send them with this user's credentials."""
    from ..export.exporter import spool_dir_from_env
    from ..export.spool import Spool, folder_problem
    from .common import CliError

    directory = args.dir or spool_dir_from_env()
    problem = folder_problem(directory)
    if problem is None:
        spool = Spool(directory)
        problem = spool.unsafe  # its own check, on the folder it opened (swapped meanwhile?)
        if problem is None:
            return spool
    raise CliError(f"spool folder refused: {problem}")


def _info(args: argparse.Namespace, line: str) -> None:
    if not args.quiet:
        print(line, file=sys.stderr)


def _spans(data: bytes) -> int | None:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    try:
        request = ExportTraceServiceRequest.FromString(data)
    except DecodeError:
        return None
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def _destination(record: Path) -> str:
    from ..export.spool import record_destination

    return record_destination(record) or UNKNOWN


def _describe(spool: Spool, destination: str) -> str:
    from ..export.destination import NO_DESTINATION

    if destination == NO_DESTINATION:
        return "none: spooled with no endpoint set; `otelprof spool replay` sends these wherever it is told"
    if destination == UNKNOWN:
        return "unknown: spooled by an otelprof older than destinations; `otelprof spool replay` sends these"
    doc = spool.describe(destination)
    if doc is None:
        return "(no description kept)"
    headers = doc.get("headers") or []
    named = f", headers {', '.join(map(str, headers))}" if isinstance(headers, list) and headers else ""
    return f"{doc.get('endpoint')} ({doc.get('protocol')}{named})"


def _ls(args: argparse.Namespace) -> int:
    spool = _spool(args)
    total_bytes = total_spans = 0
    per_destination: Counter[str] = Counter()
    for record, data in spool:
        spans = _spans(data)
        total_bytes += len(data)
        total_spans += spans or 0
        destination = _destination(record)
        per_destination[destination] += 1
        print(f"{record.name}\t{len(data)} bytes\t{'unreadable' if spans is None else f'{spans} spans'}\t{destination}")
    _info(
        args, f"{sum(per_destination.values())} requests, {total_spans} spans, {total_bytes} bytes in {spool.directory}"
    )
    for destination, count in sorted(per_destination.items()):
        _info(args, f"  destination {destination}: {count} requests, {_describe(spool, destination)}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from ..export.config import exporter_config_from_env
    from ..export.destination import NO_DESTINATION, destination_id, is_destination_id
    from ..export.exporter import transport
    from ..export.redact import redact_url

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
    chosen = set(args.destination)
    bad = sorted(d for d in chosen if d != "all" and not is_destination_id(d) and d != UNKNOWN)
    if bad:
        print(f"otelprof: error: not a destination id (see `otelprof spool ls`): {', '.join(bad)}", file=sys.stderr)
        return 2
    # records for this destination, those naming none, and the other destinations asked for
    wanted = {destination_id(cfg), NO_DESTINATION, UNKNOWN} | chosen
    spool, sent = _spool(args), 0
    records = spool.records()
    selected = [r for r in records if "all" in chosen or _destination(r) in wanted]
    with spool.replay_lock() as mine:
        if not mine:
            print(f"otelprof: error: another process is replaying {spool.directory}; try later", file=sys.stderr)
            return 1
        send, close = transport(cfg)
        try:
            for record, data in spool.read(selected):
                result = send(data)
                if not result.ok:  # keep it: the user decides (drop) or retries later
                    print(f"otelprof: error: {record.name}: {result.message}; {sent} sent, stopping", file=sys.stderr)
                    return 1
                if not spool.remove(record):
                    print(f"otelprof: error: cannot remove {record} after sending it; stopping", file=sys.stderr)
                    return 1
                sent += 1
        finally:
            close()
    _info(args, f"{sent} requests sent to {redact_url(cfg.url)}")
    kept = set(selected)
    others = Counter(_destination(r) for r in records if r not in kept)
    if others:
        _info(
            args,
            f"{sum(others.values())} requests for {len(others)} other destinations left in {spool.directory} "
            "(`otelprof spool ls`; `--destination ID` sends them to this endpoint)",
        )
    return 0


def _drop(args: argparse.Namespace) -> int:
    spool = _spool(args)
    records = spool.records()
    removed = sum(spool.remove(record) for record in records)
    _info(args, f"{removed} requests dropped from {spool.directory}")
    return 0 if removed == len(records) else 1
