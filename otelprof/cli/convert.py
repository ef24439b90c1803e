"""``otelprof convert``: Kineto traces to OTLP files (length-delimited protobuf or OTLP/JSON lines)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from .common import (
    ENGINES,
    EXIT_OK,
    CliError,
    check_kineto_file,
    convert_options,
    exit_codes,
    int_at_least,
    microseconds,
)

if TYPE_CHECKING:
    from ..converter import ConvertOptions, ConvertResult

# The converter and the output encoders are imported when the command runs, not when the parser
# is built (``otelprof --version`` builds it too), and OTLP/JSON's (protobuf's json_format and
# message classes) only for --format otlp-json.

FORMATS = ("otlp-proto", "otlp-json")

_log = logging.getLogger(__name__)

EXIT_CODES = exit_codes("a trace could not be converted or the output not written")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    epilog: str,
    add_verbosity: Callable[[argparse.ArgumentParser], None],
) -> None:
    conv = sub.add_parser(
        "convert",
        help="convert Kineto traces to OTLP files",
        description=(
            "Convert Kineto traces (.json or .json.gz, as torch.profiler writes them) into OTLP\n"
            "ExportTraceServiceRequest messages, all traces into one OUT file. Resource attributes\n"
            "come from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; options default to the\n"
            "OTELPROF_* environment variables, which the flags override."
        ),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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


# --- shared pieces -----------------------------------------------------------------------


def _write(stream: BinaryIO, fmt: str, requests: list[bytes]) -> int:
    if fmt == "otlp-proto":
        from ..otlp.file import write_delimited

        return write_delimited(stream, requests)
    from ..otlp.jsonl import encode_jsonl

    written = 0
    for chunk in encode_jsonl(requests):
        stream.write(chunk)
        written += len(chunk)
    return written


def _convert_one(path: str, options: ConvertOptions, engine: str) -> tuple[ConvertResult, float]:
    from ..converter import TraceFormatError, convert

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
        from ..otlp.file import atomic_writer

        with atomic_writer(out) as stream:
            written, requests = run(stream)
    if not args.quiet and out != "-":
        print(f"wrote {out}: {_plural(requests, 'request')}, {written} bytes, {fmt}", file=sys.stderr)
    return EXIT_OK
