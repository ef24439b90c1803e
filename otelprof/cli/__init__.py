"""The ``otelprof`` command line: the top-level parser; one module per command (``convert``,
``demo``, ``spool``, ``run``, ``summary``, ``doctor``, ``import_``), what they share in ``common``.

Exit codes, for every command: 0 success; 1 the command found something wrong (bad input, an
output not written, a failed check; one line on stderr says why); 2 usage error (bad
arguments); 130 interrupted. ``otelprof run`` exits with its command's status.

Nothing is imported at module level: ``otelprof run`` (``otelprof._launch``) imports
``otelprof.cli.run`` before anything else of the command line, and each command imports only
what it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse


def build_parser() -> argparse.ArgumentParser:
    import argparse

    from .._version import __version__
    from . import convert, demo, doctor, import_, run, spool, summary
    from .common import add_verbosity, exit_codes

    parser = argparse.ArgumentParser(
        prog="otelprof",
        description="PyTorch profiler (Kineto) traces as OpenTelemetry spans.",
        epilog=convert.EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"otelprof {__version__}")
    add_verbosity(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    convert.add_parser(sub, convert.EXIT_CODES, add_verbosity)
    demo.add_parser(sub, exit_codes("the training run failed or was not instrumented"), add_verbosity)
    spool.add_parser(sub, exit_codes("a request could not be sent"), add_verbosity)
    run.add_parser(sub, run.EXIT_CODES, add_verbosity)
    summary.add_parser(sub, exit_codes("a trace or spool could not be read"), add_verbosity)
    doctor.add_parser(sub, exit_codes("a check failed (or, with --strict, warned)"), add_verbosity)
    import_.add_parser(sub, exit_codes("a file could not be imported or its spans were refused"), add_verbosity)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (``otelprof`` passes it to ``sys.exit``)."""
    import sys

    from .common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CliError, cli_logging, one_line, os_error

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
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


__all__ = ["build_parser", "main"]
