"""``python -m otelprof.settings [--write] [FILE ...]``: the README's variable tables from the
registry; prints the files whose tables differ (exit 1), or rewrites them with ``--write``."""

from __future__ import annotations

import sys
from pathlib import Path

from . import render_tables


def main(argv: list[str]) -> int:
    write = "--write" in argv
    files = [Path(a) for a in argv if a != "--write"] or [Path("README.md")]
    stale = 0
    for path in files:
        old = path.read_text("utf-8")
        new = render_tables(old)
        if new != old:
            if write:
                path.write_text(new, "utf-8")
                print(f"rewrote {path}")
            else:
                print(f"{path}: variable tables differ from otelprof/settings/variables.py (--write fixes)")
                stale += 1
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
