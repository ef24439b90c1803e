"""``otelprof run [--] COMMAND [ARGS...]``: runs a command with every Python process it starts
instrumented, as ``opentelemetry-instrument`` does: a ``sitecustomize`` on PYTHONPATH imports
``otelprof.auto`` at interpreter start, so the script needs no change."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from . import _bootstrap
from ._cli_common import EXIT_USAGE

BOOTSTRAP_DIR = str(Path(_bootstrap.__file__).resolve().parent)
EXIT_NOT_FOUND = 127  # as a shell answers a command it cannot find

EXIT_CODES = f"""\
exit codes:
  the command's own exit status (otelprof replaces itself with it)
  2    usage error (no command given)
  {EXIT_NOT_FOUND}  the command was not found
"""


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    epilog: str,
    add_verbosity: Callable[[argparse.ArgumentParser], None],
) -> None:
    run = sub.add_parser(
        "run",
        help="run a training command with otelprof's auto-instrumentation",
        description="Run COMMAND with every Python process it starts instrumented (steps, metrics,\n"
        "profiling windows), configured by the OTEL_* and OTELPROF_* environment variables.\n"
        "otelprof's own flags (-q, -v) go before '--'; everything after it is the command.\n"
        "Example: otelprof run -- python train.py --epochs 3",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity(run)
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS...]")
    run.set_defaults(func=_run)


def command_environment(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with the bootstrap directory first on PYTHONPATH."""
    env = dict(environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])
    return env


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("otelprof: error: run needs a command, e.g. otelprof run -- python train.py", file=sys.stderr)
        return EXIT_USAGE
    executable = shutil.which(command[0])
    if executable is None:
        print(f"otelprof: error: {command[0]}: command not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(executable, command, command_environment(dict(os.environ)))
    return 0  # pragma: no cover - execve does not return
