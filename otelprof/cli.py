"""The ``otelprof`` command line.

Exit codes, for every command: 0 success; 1 the command found something wrong (bad input, an
output not written, a failed check; one line on stderr says why); 2 usage error (bad
arguments); 130 interrupted. ``otelprof run`` exits with its command's status.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import BinaryIO

from . import demo_cli, doctor_cli, import_cli, run_cli, spool_cli, summary_cli
from ._cli_common import (
    ENGINES,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    add_verbosity,
    check_kineto_file,
    cli_logging,
    convert_options,
    exit_codes,
    int_at_least,
    microseconds,
    one_line,
    os_error,
)
from ._version import __version__
from .converter import ConvertOptions, ConvertResult, TraceFormatError, convert
from .otlp.file import atomic_writer, write_delimited
from .otlp.jsonl import encode_jsonl

FORMATS = ("otlp-proto", "otlp-json")

_log = logging.getLogger(__name__)

_EXIT_CODES = exit_codes("a trace could not be converted or the output not written")


# --- argument parsing --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="otelprof",
        description="PyTorch profiler (Kineto) traces as OpenTelemetry spans.",
        epilog=_EXIT_CODES,
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"otelprof {__version__}")
    add_verbosity(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    conv = sub.add_parser(
        "convert",
        help="convert Kineto traces to OTLP files",
        description=(
            "Convert Kineto traces (.json or .json.gz, as torch.profiler writes them) into OTLP\n"
            "ExportTraceServiceRequest messages, all traces into one OUT file. Resource attributes\n"
            "come from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; options default to the\n"
            "OTELPROF_* environment variables, which the flags override."
        ),
        epilog=_EXIT_CODES,
        formatter_class=fmt,
    )
    add_verbosity(conv)
    conv.add_argument("traces", nargs="+", metavar="TRACE", help="Kineto trace file (.json or .json.gz)")
    conv.add_argument("-o", "--output", required=True, metavar="OUT", help="output file ('-' for stdout)")
    conv.add_argument(
        "--format",
        choices=FORMATS,
        help="otlp-proto: length-delimited binary protobuf messages; otlp-json: one OTLP/JSON request "
        "per line, as the Collector's otlpjsonfile receiver reads (default: otlp-json when OUT ends "
        "in .json or .jsonl, else otlp-proto)",
    )
    conv.add_argument(
        "--detail", choices=("full", "default"), help="full: every event becomes a span (default: $OTELPROF_DETAIL)"
    )
    conv.add_argument("--run-id", metavar="ID", help="run id that trace ids derive from (default: $OTELPROF_RUN_ID)")
    conv.add_argument(
        "--max-request-bytes",
        type=int_at_least(1024),
        metavar="N",
        help="split requests larger than N bytes (default: $OTELPROF_MAX_REQUEST_BYTES or 3 MiB)",
    )
    conv.add_argument(
        "--min-duration-us",
        type=microseconds,
        metavar="US",
        help="at default detail, shorter CPU events are not spans (default: $OTELPROF_MIN_DURATION_US or 10)",
    )
    conv.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="native C++ core, Python reference, or auto: native when built (default: auto)",
    )
    conv.set_defaults(func=_cmd_convert)

    demo_cli.add_parser(sub, exit_codes("the training run failed or was not instrumented"), add_verbosity)
    spool_cli.add_parser(sub, exit_codes("a request could not be sent"), add_verbosity)
    run_cli.add_parser(sub, run_cli.EXIT_CODES, add_verbosity)
    summary_cli.add_parser(sub, exit_codes("a trace or spool could not be read"), add_verbosity)
    doctor_cli.add_parser(sub, exit_codes("a check failed (or, with --strict, warned)"), add_verbosity)
    import_cli.add_parser(sub, exit_codes("a file could not be imported or its spans were refused"), add_verbosity)
    return parser


# --- shared pieces -----------------------------------------------------------------------


def _write(stream: BinaryIO, fmt: str, requests: list[bytes]) -> int:
    if fmt == "otlp-proto":
        return write_delimited(stream, requests)
    written = 0
    for chunk in encode_jsonl(requests):
        stream.write(chunk)
        written += len(chunk)
    return written


def _convert_one(path: str, options: ConvertOptions, engine: str) -> tuple[ConvertResult, float]:
    check_kineto_file(path)
    started = time.perf_counter()
    try:
        result = convert(path, options=options, engine=engine)
    except TraceFormatError as exc:
        message = str(exc)
        raise CliError(message if message.startswith(path) else f"{path}: {message}") from None
    except RuntimeError as exc:  # engine="native" without the compiled module
        raise CliError(str(exc)) from None
    return result, time.perf_counter() - started


def _summary(path: str, result: ConvertResult, seconds: float) -> str:
    nbytes = sum(len(r) for r in result.requests)
    return (
        f"{path}: {result.stats.get('spans', 0)} spans, {_plural(len(result.requests), 'request')}, "
        f"{nbytes} bytes, {seconds:.2f} s, engine {result.engine}"
    )


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# --- convert -----------------------------------------------------------------------------


def _cmd_convert(args: argparse.Namespace) -> int:
    options = convert_options(args)
    out: str = args.output
    fmt: str = args.format or ("otlp-json" if out.endswith((".json", ".jsonl")) else "otlp-proto")

    def run(stream: BinaryIO) -> tuple[int, int]:
        written = requests = 0
        for path in args.traces:
            result, seconds = _convert_one(path, options, args.engine)
            written += _write(stream, fmt, result.requests)
            requests += len(result.requests)
            _log.info("%s: stats %s", path, result.stats)
            if not args.quiet:
                print(_summary(path, result, seconds), file=sys.stderr)
        return written, requests

    if out == "-":
        written, requests = run(sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        with atomic_writer(out) as stream:
            written, requests = run(stream)
    if not args.quiet and out != "-":
        print(f"wrote {out}: {_plural(requests, 'request')}, {written} bytes, {fmt}", file=sys.stderr)
    return EXIT_OK


# --- entry point -------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (``otelprof`` passes it to ``sys.exit``)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_usage(sys.stderr)
        commands = ", ".join(sorted(_commands(parser)))
        print(f"otelprof: error: a command is required ({commands})", file=sys.stderr)
        return EXIT_USAGE
    with cli_logging(args.quiet, args.verbose):
        try:
            code: int = args.func(args)
            return code
        except CliError as exc:
            print(f"otelprof: error: {one_line(exc)}", file=sys.stderr)
        except OSError as exc:
            print(f"otelprof: error: {one_line(os_error(exc))}", file=sys.stderr)
        except KeyboardInterrupt:
            print("otelprof: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
    return EXIT_ERROR


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


__all__ = ["build_parser", "main"]
