"""``python -m otelprof``: the ``otelprof`` command line."""

from ._launch import main

raise SystemExit(main())
