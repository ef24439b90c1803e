"""Conversion settings from the environment: OpenTelemetry resource variables and ``OTELPROF_*``.

Bad values never raise: each logs one warning naming the variable and what is used instead.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

from ._config import env_int
from ._version import __version__
from .converter import ConvertOptions
from .converter._options import (
    DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MIN_DURATION_NS,
    DEFAULT_SPAN_BUDGET,
    DEFAULT_SPLIT_WORLD_SIZE,
    Detail,
)
from .environment_variables import (
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
    for entry in environ.get(OTEL_RESOURCE_ATTRIBUTES, "").split(","):
        if not entry.strip():
            continue
        parsed = _parse_entry(entry)
        if isinstance(parsed, str):
            _log.warning("%s: ignoring invalid entry %r (%s)", OTEL_RESOURCE_ATTRIBUTES, entry, parsed)
            continue
        attrs[parsed[0]] = parsed[1]
    service = environ.get(OTEL_SERVICE_NAME, "").strip()
    if service:
        attrs[SERVICE_NAME] = service
    head = [(SERVICE_NAME, attrs.pop(SERVICE_NAME))] if SERVICE_NAME in attrs else []
    return tuple(head + list(attrs.items()))


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _detail(environ: Mapping[str, str]) -> Detail:
    raw = _env(environ, OTELPROF_DETAIL)
    if raw is None or raw.lower() == "default":
        return "default"
    if raw.lower() == "full":
        return "full"
    _log.warning("%s=%r is not 'full' or 'default'; using 'default'", OTELPROF_DETAIL, raw)
    return "default"


def _max_request_bytes(environ: Mapping[str, str]) -> int:
    raw = _env(environ, OTELPROF_MAX_REQUEST_BYTES)
    if raw is None:
        return DEFAULT_MAX_REQUEST_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1024:
        _log.warning(
            "%s=%r is not an integer >= 1024; using %d", OTELPROF_MAX_REQUEST_BYTES, raw, DEFAULT_MAX_REQUEST_BYTES
        )
        return DEFAULT_MAX_REQUEST_BYTES
    return value


def _min_duration_ns(environ: Mapping[str, str]) -> int:
    raw = _env(environ, OTELPROF_MIN_DURATION_US)
    if raw is None:
        return DEFAULT_MIN_DURATION_NS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= 9e12):  # 9e12 us fits int64 ns
        _log.warning(
            "%s=%r is not a non-negative number of microseconds; using %g",
            OTELPROF_MIN_DURATION_US,
            raw,
            DEFAULT_MIN_DURATION_NS / 1000,
        )
        return DEFAULT_MIN_DURATION_NS
    return round(value * 1000)


def _attribute_value_length_limit(environ: Mapping[str, str]) -> int:
    """The span-specific variable when set, else the general one (the spec's precedence)."""
    for name in (OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT):
        if _env(environ, name) is not None:
            return env_int(environ, name, DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT, 0, 2**31 - 1)
    return DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT


def options_from_env(environ: Mapping[str, str] = os.environ, **overrides: Any) -> ConvertOptions:
    """:class:`ConvertOptions` from ``OTELPROF_*``, ``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_[SPAN_]ATTRIBUTE_VALUE_LENGTH_LIMIT``, with
    ``scope_version`` set to otelprof's version.

    Keyword ``overrides`` (any :class:`ConvertOptions` field) take precedence over the
    environment; unlike environment values, a bad override raises ``ValueError``.
    """
    opts = ConvertOptions(
        run_id=_env(environ, OTELPROF_RUN_ID),
        detail=_detail(environ),
        min_duration_ns=_min_duration_ns(environ),
        max_request_bytes=_max_request_bytes(environ),
        attribute_value_length_limit=_attribute_value_length_limit(environ),
        split_world_size=env_int(environ, OTELPROF_SPLIT_WORLD_SIZE, DEFAULT_SPLIT_WORLD_SIZE),
        span_budget=env_int(environ, OTELPROF_SPAN_BUDGET, DEFAULT_SPAN_BUDGET),
        resource_attributes=resource_attributes_from_env(environ),
        scope_version=__version__,
    )
    return dataclasses.replace(opts, **overrides) if overrides else opts


__all__ = ["options_from_env", "resource_attributes_from_env"]
