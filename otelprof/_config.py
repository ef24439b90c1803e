"""The instrumentor's settings, parsed once from the environment (variables defined in
environment_variables.py). A bad value logs a warning naming it and the default applies."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .environment_variables import (
    OTEL_EXPORTER_PROMETHEUS_HOST,
    OTEL_EXPORTER_PROMETHEUS_PORT,
    OTEL_SDK_DISABLED,
    OTELPROF_ENABLED,
)

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    enabled: bool = True
    metrics_host: str = "localhost"
    metrics_port: int = 9464


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("true", "1", "yes", "on"):
        return True
    if raw in ("false", "0", "no", "off"):
        return False
    _log.warning("%s=%r is not true or false; using %s", name, raw, str(default).lower())
    return default


def env_int(environ: Mapping[str, str], name: str, default: int, low: int = 0, high: int | None = None) -> int:
    """An integer variable in [low, high]; unset, empty or invalid gives ``default`` (warned)."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
        if value < low or (high is not None and value > high):
            raise ValueError
    except ValueError:
        bounds = f"from {low}" + (f" to {high}" if high is not None else "")
        _log.warning("%s=%r is not an integer %s; using %d", name, raw, bounds, default)
        return default
    return value


def settings_from_env(environ: Mapping[str, str] = os.environ) -> Settings:
    enabled = _flag(environ, OTELPROF_ENABLED, True) and not _flag(environ, OTEL_SDK_DISABLED, False)
    return Settings(
        enabled=enabled,
        metrics_host=environ.get(OTEL_EXPORTER_PROMETHEUS_HOST, "").strip() or "localhost",
        metrics_port=env_int(environ, OTEL_EXPORTER_PROMETHEUS_PORT, 9464, 0, 65535),
    )
