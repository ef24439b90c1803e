"""``python -m otelprof``: the ``otelprof`` command line."""

from .cli import main

raise SystemExit(main())
