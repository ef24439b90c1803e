"""What every ``otelprof`` subcommand shares: exit codes, ``--quiet``/``--verbose``, the log
format, one-line errors, and the argument types and converter flags several commands take."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .._logformat import Formatter as _Formatter

if TYPE_CHECKING:
    from ..converter import ConvertOptions

EXIT_OK = 0
EXIT_ERROR = 1  # the command ran and found something wrong (bad input, a failed check, ...)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
ENGINES = ("auto", "native", "reference")


def exit_codes(failure: str) -> str:
    """The ``exit codes:`` epilog of a command; ``failure`` says what exit code 1 means there."""
    return f"""\
exit codes:
  0    success
  1    {failure} (one line on stderr says why)
  2    usage error
  130  interrupted
"""


class CliError(Exception):
    """A failure reported as one line on stderr with exit code 1."""


def add_verbosity(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """``-q``/``--quiet`` and ``-v``/``--verbose``, accepted before and after the subcommand.

    A subcommand's default must not overwrite what was given before it, hence SUPPRESS there.
    """
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print only errors",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if top else argparse.SUPPRESS,
        help="more log output (repeat for debug)",
    )


def int_at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    """An argparse ``type`` accepting integers >= ``minimum`` (``why`` explains the bound)."""
    bound = f"{minimum} ({why})" if why else str(minimum)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {bound}, not {value}")
        return value

    return parse


def microseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 9e12:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a non-negative number of microseconds, not {text}")
    return value


def convert_options(args: argparse.Namespace) -> ConvertOptions:
    """The converter options of ``convert`` and ``import``: the environment's, overridden by
    ``--detail``, ``--run-id``, ``--max-request-bytes`` and ``--min-duration-us``."""
    from ..resource import options_from_env

    overrides: dict[str, Any] = {}
    if args.detail is not None:
        overrides["detail"] = args.detail
    if args.run_id is not None:
        overrides["run_id"] = args.run_id
    if args.max_request_bytes is not None:
        overrides["max_request_bytes"] = args.max_request_bytes
    if args.min_duration_us is not None:
        overrides["min_duration_ns"] = round(args.min_duration_us * 1000)
    return options_from_env(os.environ, **overrides)


def log_level(quiet: bool, verbose: int) -> int:
    if quiet:
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)


@contextmanager
def cli_logging(quiet: bool, verbose: int) -> Iterator[None]:
    """The ``otelprof`` logger writes ``otelprof: LEVEL: message`` lines to stderr at the level
    the flags ask for, for the duration of a command."""
    logger = logging.getLogger("otelprof")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    saved_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(log_level(quiet, verbose))
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved_level)


def check_kineto_file(path: str) -> None:
    """``CliError`` for a file that is an Nsight Systems export or report rather than a Kineto
    trace: the converter would only see bytes that are not JSON; ``otelprof import`` reads it."""
    from ..importer.discover import SQLITE_MAGIC

    if path.endswith((".nsys-rep", ".qdrep")):
        raise CliError(
            f"{path}: an Nsight Systems report, not a Kineto trace: export it with "
            f"`nsys export --type sqlite {path}`, then `otelprof import` the .sqlite"
        )
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
    except OSError:
        return  # the conversion reports it
    if magic == SQLITE_MAGIC:
        raise CliError(
            f"{path}: a SQLite database (an Nsight Systems export?), not a Kineto trace: "
            f"`otelprof import {path}` sends an nsys export as spans"
        )


def one_line(message: object) -> str:
    return " ".join(str(message).splitlines()) or type(message).__name__


def os_error(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"
