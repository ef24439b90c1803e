"""Conversion settings from the environment: OpenTelemetry resource variables and ``OTELPROF_*``.

Bad values never raise: each logs one warning naming the variable and what is used instead.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

from ._version import __version__
from .converter import ConvertOptions
from .settings import EntryWarnings, first_set, quoted, text, value
from .settings.variables import (
    OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    OTEL_RESOURCE_ATTRIBUTES,
    OTEL_SERVICE_NAME,
    OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    OTELPROF_DETAIL,
    OTELPROF_MAX_REQUEST_BYTES,
    OTELPROF_MIN_DURATION_US,
    OTELPROF_RUN_ID,
    OTELPROF_SPAN_BUDGET,
    OTELPROF_SPLIT_WORLD_SIZE,
)

_log = logging.getLogger(__name__)

SERVICE_NAME = "service.name"
#: A W3C Baggage key: an RFC 7230 token.
_KEY_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
#: A ``%`` not starting a two-hex-digit escape.
_BAD_ESCAPE_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _decode_value(raw: str) -> str | None:
    """Percent-decode one value as UTF-8; ``None`` when the encoding is malformed."""
    if _BAD_ESCAPE_RE.search(raw):
        return None
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _parse_entry(entry: str) -> tuple[str, str] | str:
    """``(key, value)`` for a valid ``key=value`` entry, else the reason it is invalid."""
    key, sep, raw = entry.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep:
        return "no '='"
    if not key:
        return "empty key"
    if not _KEY_RE.match(key):
        return "key is not a token"
    value = _decode_value(raw)
    if value is None:
        return "bad percent-encoding"
    return key, value


def resource_attributes_from_env(environ: Mapping[str, str] = os.environ) -> tuple[tuple[str, str], ...]:
    """Resource attributes from ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``.

    Follows the OpenTelemetry SDK specification: comma-separated ``key=value`` entries with
    percent-encoded values; surrounding whitespace is ignored; a later duplicate key replaces an
    earlier one. An invalid entry is skipped with a warning. A non-empty ``OTEL_SERVICE_NAME``
    replaces any ``service.name`` entry. ``service.name``, when present, comes first.
    """
    attrs: dict[str, str] = {}
    skipped = EntryWarnings(_log)
    for entry in (text(environ, OTEL_RESOURCE_ATTRIBUTES) or "").split(","):
        if not entry.strip():
            continue
        parsed = _parse_entry(entry)
        if isinstance(parsed, str):
            skipped.warn("%s: ignoring invalid entry %s (%s)", OTEL_RESOURCE_ATTRIBUTES, quoted(entry), parsed)
            continue
        attrs[parsed[0]] = parsed[1]
    skipped.done()
    service = text(environ, OTEL_SERVICE_NAME)
    if service:
        attrs[SERVICE_NAME] = service
    head = [(SERVICE_NAME, attrs.pop(SERVICE_NAME))] if SERVICE_NAME in attrs else []
    return tuple(head + list(attrs.items()))


def _attribute_value_length_limit(environ: Mapping[str, str]) -> int:
    """The span-specific variable when set, else the general one (the spec's precedence)."""
    name = first_set(environ, OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT) or OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT
    return int(value(environ, name, _log))


#: The :class:`ConvertOptions` fields the environment gives, each with its reader.
_FIELDS: dict[str, Callable[[Mapping[str, str]], Any]] = {
    "run_id": lambda environ: value(environ, OTELPROF_RUN_ID, _log),
    "detail": lambda environ: value(environ, OTELPROF_DETAIL, _log),
    "min_duration_ns": lambda environ: round(value(environ, OTELPROF_MIN_DURATION_US, _log) * 1000),
    "max_request_bytes": lambda environ: value(environ, OTELPROF_MAX_REQUEST_BYTES, _log),
    "attribute_value_length_limit": _attribute_value_length_limit,
    "split_world_size": lambda environ: value(environ, OTELPROF_SPLIT_WORLD_SIZE, _log),
    "span_budget": lambda environ: value(environ, OTELPROF_SPAN_BUDGET, _log),
    "resource_attributes": resource_attributes_from_env,
}


def options_from_env(environ: Mapping[str, str] = os.environ, **overrides: Any) -> ConvertOptions:
    """:class:`ConvertOptions` from ``OTELPROF_*``, ``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_[SPAN_]ATTRIBUTE_VALUE_LENGTH_LIMIT``, with
    ``scope_version`` set to otelprof's version.

    Keyword ``overrides`` (any :class:`ConvertOptions` field) take precedence over the
    environment, whose variables for them are not read: a value the caller already read (the
    live session's resource attributes) warns once, not again here. Unlike environment values,
    a bad override raises ``ValueError``.
    """
    read = {name: reader(environ) for name, reader in _FIELDS.items() if name not in overrides}
    return ConvertOptions(**{"scope_version": __version__, **read, **overrides})


__all__ = ["options_from_env", "resource_attributes_from_env"]
