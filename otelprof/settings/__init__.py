"""otelprof's settings registry: every environment variable defined once (``variables.py``),
read through one set of parsers in the OpenTelemetry specification's dialect (``_kinds.py``).

Readers call :func:`value` (``settings.value(environ, OTELPROF_DETAIL, _log)``); a bad value
never raises: one warning names the variable, the value and the default used instead.
The tables of ``docs/`` and ``otelprof doctor``'s listing come from :data:`VARIABLES`;
``python -m otelprof.settings [--write]`` checks (or rewrites) the docs' tables.
"""

from __future__ import annotations

from . import variables
from ._kinds import Bool, Choice, Host, Int, Kind, Names, Number, PathKind, Text, is_utf8
from ._registry import VARIABLES, EntryWarnings, Variable, first_set, is_set, parse, quoted, text, value
from ._tables import markdown_table, render_tables

__all__ = [
    "VARIABLES",
    "Bool",
    "Choice",
    "EntryWarnings",
    "Host",
    "Int",
    "Kind",
    "Names",
    "Number",
    "PathKind",
    "Text",
    "Variable",
    "first_set",
    "is_set",
    "is_utf8",
    "markdown_table",
    "parse",
    "quoted",
    "render_tables",
    "text",
    "value",
    "variables",
]
