"""The registry: every variable otelprof reads, once, with its parser, default and doc."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._kinds import Kind, PartlyUsable, is_utf8

_log = logging.getLogger("otelprof.settings")


@dataclass(frozen=True)
class Variable:
    """One environment variable.

    ``default`` is the value an unset, empty or unusable variable gives; ``shown`` is how the
    tables and ``otelprof doctor`` write it when the value alone would not say it (``None``: the
    value, formatted by its kind). ``general`` names the variable a signal-specific one
    (``OTEL_EXPORTER_OTLP_TRACES_*``) replaces when set. ``group`` is the docs table it is in.
    ``unset_means``: what ``otelprof doctor`` says an unset variable means, where that is not the
    table's default written plainly.
    """

    name: str
    kind: Kind
    default: Any
    doc: str
    group: str
    shown: str | None = None
    general: str | None = None
    unset_means: str | None = None

    @property
    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.general is not None:
            return self.general
        if self.default is None:
            return "unset"
        return self.default if isinstance(self.default, str) else self.kind.show(self.default)

    @property
    def summary(self) -> str:
        """The doc on one line (the tables' cell)."""
        return " ".join(self.doc.split())


#: Every variable, in definition order (the tables' order).
VARIABLES: dict[str, Variable] = {}


def define(
    name: str,
    kind: Kind,
    default: Any,
    doc: str,
    group: str,
    shown: str | None = None,
    general: str | None = None,
    unset_means: str | None = None,
) -> str:
    """Registers a variable; returns its name (the module constant the readers import)."""
    if name in VARIABLES:
        raise RuntimeError(f"{name} is defined twice")
    VARIABLES[name] = Variable(name, kind, default, doc, group, shown, general, unset_means)
    return name


def parse(environ: Mapping[str, str], name: str, kind: Kind, default: Any, log: logging.Logger | None = None) -> Any:
    """``name``'s value read with ``kind`` (also for variables not in the registry, a launcher's
    ``RANK``): unset or empty gives ``default``; an unusable value logs one warning naming the
    variable, the value and the default used instead, and gives the default. Never raises."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind.parse(raw)
    except PartlyUsable as partly:  # a list with unknown entries: those are skipped, the rest kept
        more = f" and {len(partly.bad) - 1} more" if len(partly.bad) > 1 else ""
        (log or _log).warning(
            "%s=%s: %s%s not %s; using %s",
            name,
            quoted(raw),
            quoted(partly.bad[0]),
            more,
            kind.expect,
            kind.show(partly.value),
        )
        return partly.value
    except ValueError:
        shown = "unset" if default is None else kind.show(default)
        if not is_utf8(raw):  # never quoted: it may be a secret's (OTELPROF_PROFILE_TOKEN's) bytes
            (log or _log).warning("%s has bytes that are not UTF-8; using %s", name, shown)
        else:
            (log or _log).warning("%s=%s is not %s; using %s", name, quoted(raw), kind.expect, shown)
        return default


#: Characters of a bad value a warning quotes: a whole 100k-character value is no help in a log.
QUOTED_CHARS = 80


def quoted(raw: str) -> str:
    """``raw`` as a warning quotes it: ``repr`` (control characters escaped), cut past
    :data:`QUOTED_CHARS` characters with its length said."""
    if len(raw) <= QUOTED_CHARS:
        return repr(raw)
    return f"{raw[:QUOTED_CHARS]!r}... ({len(raw)} characters)"


class EntryWarnings:
    """The bad entries of one list-valued variable (``key=value,...``): one warning in all, for
    the first, saying how many more were skipped (a value of 50,000 bad entries is one line).
    ``warn()`` each, then ``done()``."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._first: tuple[str, tuple[object, ...]] | None = None
        self._more = 0

    def warn(self, message: str, *args: object) -> None:
        if self._first is None:
            self._first = (message, args)
        else:
            self._more += 1

    def done(self) -> None:
        if self._first is not None:
            message, args = self._first
            if self._more:
                message, args = message + " (and %d more entries skipped)", (*args, self._more)
            self._log.warning(message, *args)
        self._first, self._more = None, 0


def value(environ: Mapping[str, str], name: str, log: logging.Logger | None = None) -> Any:
    """The registered variable ``name``'s value in ``environ`` (see :func:`parse`). ``log``: the
    reading module's logger, so a warning says which part of otelprof read the value."""
    var = VARIABLES[name]
    return parse(environ, name, var.kind, var.default, log)


def is_set(environ: Mapping[str, str], name: str) -> bool:
    """Whether ``name`` has a non-empty value (the specification: empty is unset)."""
    return bool(environ.get(name, "").strip())


def first_set(environ: Mapping[str, str], *names: str) -> str | None:
    """The first of ``names`` that is set (a signal-specific variable before its general one)."""
    return next((name for name in names if is_set(environ, name)), None)


def text(environ: Mapping[str, str], name: str) -> str | None:
    """A registered variable's text, stripped, or None when unset or empty (for the variables
    whose text is parsed entry by entry where it is used: headers, resource attributes). Text
    that is not UTF-8 is None too, after one warning that names the variable, not the value (a
    header's may be a credential)."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not in otelprof.settings.variables")
    raw = environ.get(name, "").strip()
    if not is_utf8(raw):
        _log.warning("%s has bytes that are not UTF-8; ignored", name)
        return None
    return raw or None
