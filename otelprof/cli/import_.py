"""``otelprof import PATH...``: send existing traces (Kineto JSON, Nsight Systems SQLite exports)
to the configured OTLP endpoint, or to the spool, resumably.

The work is in ``otelprof/importer/``; this module is the command line around it: flags,
signals (the first SIGINT/SIGTERM stops after the batch in flight, a second quits at once),
the progress line and the summary, which ends with when the spans sent were recorded and how
to find them: traces keep their recording time, and trace UIs open on the last hours.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from .common import (
    ENGINES,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CliError,
    convert_options,
    int_at_least,
    microseconds,
)

# The importer, the converter, the settings tables and the exporter are imported when the
# command runs, not when the parser is built (every ``otelprof`` command line builds it).
if TYPE_CHECKING:
    from ..converter import ConvertOptions, ConvertResult
    from ..export.config import ExporterConfig
    from ..export.exporter import Exporter, ExporterCounters
    from ..importer.discover import Source
    from ..importer.ledger import Ledger
    from ..importer.progress import Progress
    from ..importer.session import Importer, Report

_log = logging.getLogger(__name__)

#: An import is a batch job: it can wait for a slow backend (a 2.4 MB request took MLflow over
#: the exporter's 10 s default; a timed-out request is sent again, and stored twice by a backend
#: that does not deduplicate by span id). Used when OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT is unset.
IMPORT_TIMEOUT_S = 30.0
#: Imported traces' ``service.name`` when the user names none.
IMPORT_SERVICE_NAME = "otelprof-import"
#: Over OTLP/HTTP, requests of 1 MiB rather than 3 MiB (when neither --max-request-bytes nor
#: OTELPROF_MAX_REQUEST_BYTES says): a backend that stores a request before answering (MLflow)
#: answers each well within the timeout.
HTTP_IMPORT_REQUEST_BYTES = 1024 * 1024

EPILOG = """\
exit codes:
  0    every file was delivered (sent, or spooled when no endpoint is set or it is unreachable)
  1    a file could not be read (one line each; nothing of that file is sent, the others are),
       or requests were lost (rejected by the backend, or the spool could not take them): the
       ledger does not record them, --resume sends them again
  2    usage error
  130  interrupted: what was delivered is in the ledger; rerun with --resume for the rest

Without --run-id, files in one folder whose names differ only in numbers (rank-0/rank-1,
worker0/worker1, Composer's rank{rank}.{batch}) are one run: step N of every rank is one trace.
The ledger defaults to ~/.cache/otelprof/imports/<hash of the PATH arguments>.json.
"""


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    epilog: str,
    add_verbosity: Callable[[argparse.ArgumentParser], None],
) -> None:
    parser = sub.add_parser(
        "import",
        help="send Kineto traces and Nsight Systems exports to the OTLP endpoint",
        description=(
            "Convert existing traces and send them over OTLP (OTEL_EXPORTER_OTLP_*), or to the spool\n"
            "when no endpoint is configured or it is unreachable. PATH: Kineto traces (.json,\n"
            ".json.gz), Nsight Systems SQLite exports (.sqlite, from `nsys export --type sqlite`), or\n"
            "folders holding them (TensorBoard log dirs, Composer torch_traces folders), searched\n"
            "recursively. Importing the same files again gives the same trace and span ids."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity(parser)
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace file or folder")
    parser.add_argument(
        "--run-id", metavar="ID", help="one run id for every file (default: $OTELPROF_RUN_ID, else per run set)"
    )
    parser.add_argument(
        "--detail", choices=("full", "default"), help="full: every event becomes a span (default: $OTELPROF_DETAIL)"
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int_at_least(1024),
        metavar="N",
        help="split requests larger than N bytes (default: $OTELPROF_MAX_REQUEST_BYTES, else 1 MiB over "
        "OTLP/HTTP and 3 MiB over gRPC)",
    )
    parser.add_argument(
        "--min-duration-us",
        type=microseconds,
        metavar="US",
        help="at default detail, shorter CPU events are not spans (default: $OTELPROF_MIN_DURATION_US or 10)",
    )
    parser.add_argument(
        "--engine", choices=ENGINES, default="auto", help="Kineto converter: native, reference or auto (default)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="skip what the ledger says an earlier, interrupted import delivered"
    )
    parser.add_argument("--ledger", type=Path, metavar="FILE", help="ledger file (default: see below)")
    parser.add_argument(
        "--batch-bytes",
        type=int_at_least(1),
        metavar="N",
        help="request bytes handed to the exporter before waiting for their delivery and recording it "
        "in the ledger (default: 8 MiB)",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress line with events/s on stderr (default: when stderr is a terminal)",
    )
    parser.set_defaults(func=_cmd_import)


@contextmanager
def _stop_on_signals(stop: threading.Event, quiet: bool) -> Iterator[None]:
    """First SIGINT/SIGTERM: finish the batch in flight, then stop. Second: quit at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        if not quiet:
            print(
                f"\notelprof: {signal.Signals(signum).name}: stopping after the requests in flight "
                "(again to quit at once)",
                file=sys.stderr,
            )

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def with_import_service(options: ConvertOptions) -> ConvertOptions:
    """``service.name=otelprof-import`` unless the user named the service
    (``OTEL_SERVICE_NAME``, or ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``): a backend's
    service list shows that, not the SDK's ``unknown_service``."""
    import dataclasses

    from ..resource import SERVICE_NAME

    if any(key == SERVICE_NAME for key, _ in options.resource_attributes):
        return options
    attributes = ((SERVICE_NAME, IMPORT_SERVICE_NAME), *options.resource_attributes)
    return dataclasses.replace(options, resource_attributes=attributes)


def import_exporter_config(environ: Mapping[str, str]) -> ExporterConfig:
    """The exporter's configuration from ``OTEL_EXPORTER_OTLP_*``, with the import's longer
    timeout where no timeout variable is set."""
    import dataclasses

    from ..export.config import exporter_config_from_env
    from ..settings import first_set
    from ..settings.variables import OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT

    config = exporter_config_from_env(environ)
    if first_set(environ, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, OTEL_EXPORTER_OTLP_TIMEOUT):
        return config
    return dataclasses.replace(config, timeout_s=IMPORT_TIMEOUT_S)


@dataclass(frozen=True)
class _Plan:
    """What the command line asks for, checked: the conversion options, the files, the ledger
    and the exporter's configuration."""

    options: ConvertOptions
    sources: list[Source]
    ledger_path: Path
    ledger: Ledger
    config: ExporterConfig


def _cmd_import(args: argparse.Namespace) -> int:
    plan = _plan(args)
    importer, exporter, progress, stop = _importer(args, plan)
    try:
        with _stop_on_signals(stop, args.quiet):
            report = importer.run(plan.sources)
    except KeyboardInterrupt:  # a second Ctrl-C: what is queued goes to the spool, unrecorded
        progress.close()
        exporter.shutdown(timeout_s=2.0)
        raise
    finally:
        progress.close()
    exporter.shutdown(timeout_s=10.0)
    if not args.quiet:
        _print_summary(report, len(plan.sources), exporter.counters, exporter)
    return _exit_code(report, exporter, plan.ledger_path)


def _plan(args: argparse.Namespace) -> _Plan:
    """The files, the ledger and the exporter's configuration, or a CliError saying why not;
    over OTLP/HTTP smaller requests unless the user chose their size."""
    import dataclasses

    from ..importer.discover import SourceError, find_sources
    from ..importer.ledger import Ledger, LedgerError, default_path
    from ..settings import is_set
    from ..settings.variables import OTELPROF_MAX_REQUEST_BYTES

    base = with_import_service(convert_options(args))
    try:
        sources = find_sources(args.paths, run_id=base.run_id)
    except SourceError as exc:
        raise CliError(str(exc)) from None
    ledger_path: Path = args.ledger or default_path(args.paths)
    try:
        ledger = Ledger.load(ledger_path) if args.resume else Ledger(ledger_path)
    except LedgerError as exc:
        raise CliError(str(exc)) from None
    config = import_exporter_config(os.environ)
    if config.disabled:
        raise CliError("export is disabled (OTEL_SDK_DISABLED=true): nothing would be sent")
    told = args.max_request_bytes is not None or is_set(os.environ, OTELPROF_MAX_REQUEST_BYTES)
    if config.protocol == "http/protobuf" and not told:
        base = dataclasses.replace(base, max_request_bytes=HTTP_IMPORT_REQUEST_BYTES)
    return _Plan(base, sources, ledger_path, ledger, config)


def _importer(args: argparse.Namespace, plan: _Plan) -> tuple[Importer, Exporter, Progress, threading.Event]:
    """The importer of the plan's files, with its exporter, progress line and stop flag."""
    import dataclasses

    from ..export.exporter import Exporter
    from ..importer.progress import Progress
    from ..importer.session import DEFAULT_BATCH_BYTES, Importer

    base, sources = plan.options, plan.sources

    def options_for(source: Source) -> ConvertOptions:
        rank = source.rank if source.rank is not None else base.rank
        return dataclasses.replace(base, run_id=source.run_id, rank=rank)

    show = args.progress if args.progress is not None else (sys.stderr.isatty() and not args.quiet)
    progress = Progress(sys.stderr, len(sources), sum(s.size for s in sources), enabled=show)

    def on_error(message: str) -> None:
        progress.close()
        print(f"otelprof: error: {message}", file=sys.stderr)

    def on_file(source: Source, result: ConvertResult, skipped: int) -> None:
        _log.info(
            "%s: %s spans in %d requests (%d already delivered), run id %r, rank %s",
            source.path,
            result.stats.get("spans", 0),
            len(result.requests),
            skipped,
            source.run_id,
            source.rank,
        )

    exporter = Exporter(plan.config)
    stop = threading.Event()
    importer = Importer(
        exporter,
        plan.ledger,
        options_for,
        engine=args.engine,
        resume=args.resume,
        progress=progress,
        stop=stop,
        on_error=on_error,
        on_file=on_file,
        batch_bytes=DEFAULT_BATCH_BYTES if args.batch_bytes is None else args.batch_bytes,
    )
    return importer, exporter, progress, stop


def _exit_code(report: Report, exporter: Exporter, ledger_path: Path) -> int:
    """The exit code, each failure told on stderr: interrupted, the spool overflowing, requests
    lost, files that could not be read."""
    counters = exporter.counters
    if report.stopped:
        print(
            f"otelprof: interrupted: what was delivered is recorded in {ledger_path}; "
            "run the same command with --resume to send the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    evicted = exporter.spool.counters.evicted
    if evicted:  # the spool is bounded: a big import with no backend pushes out its own oldest requests
        print(
            f"otelprof: error: the spool {exporter.spool.directory} was full: {evicted} older requests were "
            "evicted; import again, without --resume, with a reachable endpoint",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if counters.requests_dropped:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(counters.dropped_by_reason.items()))
        print(
            f"otelprof: error: {counters.requests_dropped} requests were lost ({reasons}; see the warnings "
            "above); the ledger does not record them: --resume sends them again",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return EXIT_ERROR if report.files_failed else EXIT_OK


def _print_summary(report: Report, files: int, counters: ExporterCounters, exporter: Exporter) -> None:
    from ..export.config import why_no_endpoint
    from ..export.redact import redact_url

    rate = report.events / report.seconds if report.seconds > 0 else 0.0
    parts = [
        f"imported {report.files_sent} of {files} files: {report.events:,} events as {report.spans:,} spans "
        f"in {report.requests} requests, {report.seconds:.1f} s ({rate:,.0f} events/s)"
    ]
    if report.files_skipped:
        parts.append(f"{report.files_skipped} already imported (ledger)")
    if report.et_ops_joined or report.execution_traces_unpaired or report.kineto_without_execution_trace:
        parts.append(
            f"execution traces: {report.et_ops_joined:,} op spans joined, {report.et_nodes_unmatched:,} nodes "
            f"and {report.et_ops_missing:,} ops without a partner, {report.execution_traces_unpaired} files unpaired, "
            f"{report.kineto_without_execution_trace} Kineto traces without one"
        )
    exported, spooled = counters.requests_exported, counters.requests_spooled
    if exported:
        parts.append(f"{exported} requests sent to {redact_url(exporter.config.url)}")
    if counters.requests_replayed:  # spooled earlier (by this run while the backend was down, or before)
        parts.append(
            f"also {counters.requests_replayed} spooled requests replayed there from {exporter.spool.directory}"
        )
    if spooled:
        why = (
            ""
            if exporter.config.endpoint_configured
            else f" (no OTLP endpoint configured: {why_no_endpoint(os.environ)})"
        )
        parts.append(
            f"{spooled} requests spooled to {exporter.spool.directory}{why}; `otelprof spool replay` sends them"
        )
    print("; ".join(parts), file=sys.stderr)
    if report.first_start_ns is not None and report.last_end_ns is not None:
        for line in findable(report.first_start_ns, report.last_end_ns, report.trace_ids, time.time_ns()):
            print(line, file=sys.stderr)


def findable(start_ns: int, end_ns: int, trace_ids: list[bytes], now_ns: int) -> list[str]:
    """Two lines: the time range of the spans sent, and how to see them in the common UIs
    (each opens its trace list on the last hours or days; an import keeps its recording time)."""
    ago = _duration(now_ns - start_ns)
    grafana = f"from={start_ns // 1_000_000}&to={-(-end_ns // 1_000_000)}"
    ids = ", ".join(t.hex() for t in trace_ids)
    return [
        f"spans sent: from {iso_time(start_ns)} to {iso_time(end_ns)} (UTC), {ago} ago",
        f"to see them, set the trace list's time range to cover that, not its default last hours (a lookback of "
        f"at least {ago}): Jaeger's Lookback > Custom Time Range, Grafana Tempo's time picker ({grafana} in an "
        f"Explore URL), Phoenix's and MLflow's time range filter; or look up a trace id: {ids}",
    ]


def iso_time(ns: int) -> str:
    """ISO-8601 in UTC to the nanosecond: 2023-09-27T17:25:35.123456789Z."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction:09d}Z"


def _duration(ns: int) -> str:
    """How long ago, roughly, in the unit a person would use."""
    s = max(0, ns) / 1e9
    for limit, unit, size in (
        (90, "seconds", 1),
        (90 * 60, "minutes", 60),
        (36 * 3600, "hours", 3600),
        (60 * 86400, "days", 86400),
        (730 * 86400, "months", 30.44 * 86400),
    ):
        if s < limit:
            count = round(s / size)
            return f"{count} {unit if count != 1 else unit[:-1]}"
    return f"{s / (365.25 * 86400):.1f} years"


__all__ = ["add_parser"]
