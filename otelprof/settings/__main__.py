"""``python -m otelprof.settings [--write] [FILE ...]``: the docs' variable tables from the
registry; prints the files whose tables differ (exit 1), or rewrites them with ``--write``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import render_tables
from ._tables import documents


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m otelprof.settings",
        description="Check (or rewrite) the environment variable tables of Markdown files against"
        " otelprof/settings/variables.py: each table sits between '<!-- env-table: GROUP -->' and"
        " '<!-- /env-table -->' lines.",
        epilog="exit codes: 0 every table is current (or was rewritten); 1 a table differs or a"
        " file could not be read or written; 2 usage error",
    )
    parser.add_argument("--write", action="store_true", help="rewrite the tables that differ")
    parser.add_argument(
        "files", nargs="*", type=Path, metavar="FILE", help="Markdown files (default: README.md and docs/*.md)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stale = 0
    for path in args.files or documents(Path()):
        try:
            old = path.read_text("utf-8")
            new = render_tables(old)
            if new != old and args.write:
                path.write_text(new, "utf-8")
                print(f"rewrote {path}")
            elif new != old:
                print(f"{path}: variable tables differ from otelprof/settings/variables.py (--write fixes)")
                stale += 1
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            print(f"python -m otelprof.settings: error: {path}: {why}", file=sys.stderr)
            stale += 1
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
