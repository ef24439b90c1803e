"""The ``otelprof`` executable: ``otelprof run`` execs its command before anything else of the
command line is imported (it starts every training job; the converter and argparse are ~0.3 s);
every other command goes to ``otelprof.cli``."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["run"]:
        from .cli.run import launch

        code = launch(args[1:])
        if code is not None:
            return code
    from .cli import main as cli_main

    return cli_main(argv)
