"""``otelprof run [--] COMMAND [ARGS...]``: runs a command with every Python process it starts
instrumented, as ``opentelemetry-instrument`` does: a ``sitecustomize`` on PYTHONPATH waits in
each of them for ``import torch`` and instruments the process then, so the script needs no
change and a process that never imports torch (a launcher, a helper script) pays nothing.

``launch()`` is the ``otelprof run`` the executable starts without importing the rest of the
command line (argparse, the converter): ``otelprof run -- python -c pass`` costs about one
interpreter start more than ``python -c pass`` (benchmarks/overhead.py ``--bootstrap``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

TYPE_CHECKING = False  # typing's, without importing typing (launch() imports as little as it can)
if TYPE_CHECKING:
    import argparse

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "_bootstrap")
EXIT_USAGE = 2  # common.py's, not imported: launch() imports nothing it can do without
EXIT_NOT_FOUND = 127  # as a shell answers a command it cannot find
_VERBOSITY = frozenset(("-q", "--quiet", "-v", "--verbose", "-vv", "-vvv"))

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
    import argparse

    run = sub.add_parser(
        "run",
        help="run a training command with otelprof's auto-instrumentation",
        description="Run COMMAND with every Python process it starts instrumented (steps, metrics,\n"
        "profiling windows) once it imports torch, configured by the OTEL_* and OTELPROF_*\n"
        "environment variables. otelprof's own flags (-q, -v) go before '--'; everything after\n"
        "it is the command. Each process that trains writes one line to stderr saying where its\n"
        "spans and metrics go (-q or OTELPROF_QUIET=true silences it).\n"
        "Example: otelprof run -- python train.py --epochs 3",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity(run)
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS...]")
    run.set_defaults(func=_run)


def command_environment(environ: dict[str, str], quiet: bool = False) -> dict[str, str]:
    """``environ`` with the bootstrap directory first on PYTHONPATH; ``quiet`` (``-q``) sets
    OTELPROF_QUIET, which silences the line each process writes when its session starts."""
    env = dict(environ)
    if quiet:
        env["OTELPROF_QUIET"] = "true"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])
    return env


def launch(args: Sequence[str]) -> int | None:
    """``otelprof run ARGS``, parsed by hand; None when argparse must answer (``--help``, an
    unknown option, ``-q`` with ``-v``)."""
    flags = 0
    while flags < len(args) and args[flags] in _VERBOSITY:
        flags += 1
    given = {a.lstrip("-")[:1] for a in args[:flags]}
    rest = list(args[flags:])
    if len(given) > 1:
        return None
    if rest[:1] == ["--"]:
        rest = rest[1:]
    elif rest and rest[0].startswith("-"):
        return None
    return _exec(rest, quiet=given == {"q"})


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    return _exec(command, quiet=bool(getattr(args, "quiet", False)))


def _which(name: str) -> str | None:
    """``shutil.which`` for POSIX (shutil's imports cost ~5 ms of every ``otelprof run``)."""
    paths = [name] if os.path.dirname(name) else [os.path.join(d or ".", name) for d in os.get_exec_path()]
    return next((p for p in paths if os.path.isfile(p) and os.access(p, os.X_OK)), None)


def _exec(command: list[str], quiet: bool = False) -> int:
    if not command:
        print("otelprof: error: run needs a command, e.g. otelprof run -- python train.py", file=sys.stderr)
        return EXIT_USAGE
    executable = _which(command[0])
    if executable is None:
        print(f"otelprof: error: {command[0]}: command not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(executable, command, command_environment(dict(os.environ), quiet))
    return 0  # pragma: no cover - execve does not return
