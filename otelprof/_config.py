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


def _port(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        port = int(raw)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        _log.warning("%s=%r is not a port number; using %d", name, raw, default)
        return default
    return port


def settings_from_env(environ: Mapping[str, str] = os.environ) -> Settings:
    enabled = _flag(environ, OTELPROF_ENABLED, True) and not _flag(environ, OTEL_SDK_DISABLED, False)
    return Settings(
        enabled=enabled,
        metrics_host=environ.get(OTEL_EXPORTER_PROMETHEUS_HOST, "").strip() or "localhost",
        metrics_port=_port(environ, OTEL_EXPORTER_PROMETHEUS_PORT, 9464),
    )
