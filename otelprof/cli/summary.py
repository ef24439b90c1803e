"""``otelprof summary PATH...``: torch's ``key_averages()`` table for Kineto traces or a spool."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..report.sorting import SORT_ALIASES, SORT_KEYS, sort_key
from .common import EXIT_OK, EXIT_USAGE, CliError, check_kineto_file, int_at_least

# The tables, the converter and trace discovery are imported when the command runs, not when
# the parser is built (every ``otelprof`` command line builds it).
if TYPE_CHECKING:
    from ..report.summary import Summary

DEFAULT_TABLE_ROWS = 20


def _sort(text: str) -> str:
    try:
        return sort_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    epilog: str,
    add_verbosity: Callable[[argparse.ArgumentParser], None],
) -> None:
    summary = sub.add_parser(
        "summary",
        help="per-operator table (torch's key_averages) of traces or of the spool",
        description=(
            "Print torch's key_averages() table: per operator (and annotation, and kernel) the calls,\n"
            "self and total CPU time, self and total device time and their shares, as torch.profiler\n"
            "computes them. PATH is a Kineto trace (.json, .json.gz; summed by the native core), a\n"
            "folder of them (searched as `otelprof import` searches), or a spool folder of OTLP\n"
            "requests (summed from the operator spans in them: exact for traces converted at\n"
            "OTELPROF_DETAIL=full, without the events dropped at default detail).\n"
            "Several PATHs add up into one table."
        ),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity(summary)
    summary.add_argument("paths", nargs="*", metavar="PATH", help="Kineto trace, folder of traces, or spool folder")
    summary.add_argument(
        "--spool",
        action="store_true",
        help="also summarise the spool ($OTELPROF_SPOOL_DIR or ~/.cache/otelprof/spool)",
    )
    summary.add_argument(
        "--sort",
        type=_sort,
        metavar="KEY",
        help=f"{', '.join(SORT_KEYS)} (torch's {', '.join(SORT_ALIASES)} too); default: self_device when "
        "there is device time, else self_cpu",
    )
    summary.add_argument(
        "-n",
        "--limit",
        "--row-limit",
        type=int_at_least(0, "0: all rows"),
        metavar="N",
        help=f"show the first N rows, 0 for all (default: {DEFAULT_TABLE_ROWS} in the table, all in JSON)",
    )
    summary.add_argument(
        "--group-by-input-shape",
        action="store_true",
        help="one row per operator and input shapes (traces recorded with record_shapes)",
    )
    summary.add_argument("--format", choices=("table", "json"), default="table", help="default: table")
    summary.add_argument(
        "--engine",
        choices=("auto", "native", "reference"),
        default="auto",
        help="converter engine for trace files (default: auto, the native core when built)",
    )
    summary.set_defaults(func=_summary)


def _add_folder(summary: Summary, folder: Path, args: argparse.Namespace) -> None:
    """A spool folder (``*.otlp`` records), else a folder of traces found as ``import`` finds them."""
    from ..export.spool import SUFFIX, Spool, folder_problem
    from ..importer.discover import KINETO, SourceError, find_sources
    from ..report.summary import add_requests

    if any(folder.glob(f"*{SUFFIX}")):
        problem = folder_problem(folder)
        if problem is not None:  # read as the job would: never through a link, nor another's files
            raise CliError(problem)
        add_requests(summary, [(str(r), data) for r, data in Spool(folder)], args.group_by_input_shape)
        return
    try:
        sources = find_sources([folder])
    except SourceError as exc:
        raise CliError(f"{exc}; nor spooled requests (*{SUFFIX})") from None
    traces = [str(s.path) for s in sources if s.kind == KINETO]
    others = [str(s.path) for s in sources if s.kind != KINETO]
    if not traces:
        if others:
            raise CliError(f"{folder}: only Nsight Systems exports here, no Kineto traces: `otelprof import {folder}`")
        raise CliError(f"{folder}: no Kineto traces here (*.json, *.json.gz), nor spooled requests (*{SUFFIX})")
    if others:  # Nsight Systems exports: no key_averages() table of them
        summary.notes.append(
            f"{len(others)} Nsight Systems export(s) not summarised (`otelprof import` sends them): {', '.join(others)}"
        )
    for trace in traces:
        _add_trace(summary, trace, args)


def _add_trace(summary: Summary, path: str, args: argparse.Namespace) -> None:
    from ..report.summary import add_trace

    check_kineto_file(path)
    add_trace(summary, path, args.group_by_input_shape, args.engine)


def _summary(args: argparse.Namespace) -> int:
    from ..converter import TraceFormatError
    from ..report.summary import Summary, ordered, to_json, to_table

    paths: list[str] = list(args.paths)
    if args.spool:
        from ..export.exporter import spool_dir_from_env

        paths.append(str(spool_dir_from_env()))
    if not paths:
        print("otelprof: error: summary needs a PATH (or --spool)", file=sys.stderr)
        return EXIT_USAGE
    summary = Summary()
    for path in paths:
        try:
            if Path(path).is_dir():
                _add_folder(summary, Path(path), args)
            else:
                _add_trace(summary, path, args)
        except TraceFormatError as exc:
            message = str(exc)
            raise CliError(message if message.startswith(path) else f"{path}: {message}") from None
        except RuntimeError as exc:  # engine="native" without the compiled module
            raise CliError(str(exc)) from None
    has_device = any(r.self_device_ns or r.device_total_ns for r in summary.rows)
    rows = ordered(summary.rows, args.sort or ("self_device" if has_device else "self_cpu"))
    limit = args.limit if args.limit is not None else (DEFAULT_TABLE_ROWS if args.format == "table" else 0)
    shown = rows[:limit] if limit else rows
    if args.format == "json":
        sys.stdout.write(to_json(summary, shown) + "\n")
        return EXIT_OK
    sys.stdout.write(to_table(summary, shown))
    if not args.quiet:
        for note in summary.notes:
            print(f"note: {note}", file=sys.stderr)
    return EXIT_OK
