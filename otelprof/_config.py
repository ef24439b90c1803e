"""The instrumentor's settings, parsed once from the environment (variables defined in
environment_variables.py). A bad value logs a warning naming it and the default applies."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .capture.windows.profiling import WindowSettings
from .environment_variables import (
    OTEL_EXPORTER_PROMETHEUS_HOST,
    OTEL_EXPORTER_PROMETHEUS_PORT,
    OTELPROF_ANOMALY_FACTOR,
    OTELPROF_CUDA_EVENTS,
    OTELPROF_ENABLED,
    OTELPROF_ON_DEMAND_STEPS,
    OTELPROF_PROFILE,
    OTELPROF_PROFILE_ACTIVE,
    OTELPROF_PROFILE_EARLY,
    OTELPROF_PROFILE_OPTIONS,
    OTELPROF_PROFILE_REPEAT,
    OTELPROF_PROFILE_SKIP_FIRST,
    OTELPROF_PROFILE_WAIT,
    OTELPROF_PROFILE_WARMUP,
    OTELPROF_TRIGGER_FILE,
    OTELPROF_TRIGGER_HTTP,
    OTELPROF_TRIGGER_SIGNAL,
)
from .export.config import sdk_disabled

PROFILER_OPTIONS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    enabled: bool = True
    metrics_host: str = "localhost"
    metrics_port: int = 9464
    http_trigger: bool = True
    cuda_events: bool = True
    windows: WindowSettings = field(default_factory=WindowSettings)


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
    enabled = _flag(environ, OTELPROF_ENABLED, True) and not sdk_disabled(environ)
    return Settings(
        enabled=enabled,
        metrics_host=environ.get(OTEL_EXPORTER_PROMETHEUS_HOST, "").strip() or "localhost",
        metrics_port=env_int(environ, OTEL_EXPORTER_PROMETHEUS_PORT, 9464, 0, 65535),
        http_trigger=_flag(environ, OTELPROF_TRIGGER_HTTP, True),
        cuda_events=_flag(environ, OTELPROF_CUDA_EVENTS, True),
        windows=windows_from_env(environ),
    )


def windows_from_env(environ: Mapping[str, str]) -> WindowSettings:
    default = WindowSettings()
    options = {}
    for name in environ.get(OTELPROF_PROFILE_OPTIONS, "").split(","):
        name = name.strip()
        if name in PROFILER_OPTIONS:
            options[name] = True
        elif name:
            _log.warning(
                "%s: ignoring unknown option %r (known: %s)",
                OTELPROF_PROFILE_OPTIONS,
                name,
                ", ".join(PROFILER_OPTIONS),
            )
    return WindowSettings(
        enabled=_flag(environ, OTELPROF_PROFILE, True),
        skip_first=env_int(environ, OTELPROF_PROFILE_SKIP_FIRST, default.skip_first),
        wait=env_int(environ, OTELPROF_PROFILE_WAIT, default.wait),
        warmup=env_int(environ, OTELPROF_PROFILE_WARMUP, default.warmup),
        active=env_int(environ, OTELPROF_PROFILE_ACTIVE, default.active, 1),
        repeat=env_int(environ, OTELPROF_PROFILE_REPEAT, default.repeat),
        early=env_int(environ, OTELPROF_PROFILE_EARLY, default.early),
        trigger_file=environ.get(OTELPROF_TRIGGER_FILE, "").strip() or None,
        trigger_signal=_signal(environ),
        on_demand_steps=env_int(environ, OTELPROF_ON_DEMAND_STEPS, default.on_demand_steps, 1),
        anomaly_factor=_factor(environ),
        **options,
    )


def _signal(environ: Mapping[str, str]) -> int | None:
    import signal

    raw = environ.get(OTELPROF_TRIGGER_SIGNAL, "").strip().upper() or "SIGUSR2"
    if raw == "NONE":
        return None
    number = getattr(signal, raw if raw.startswith("SIG") else "SIG" + raw, None)
    if not isinstance(number, int):
        _log.warning("%s=%r is not a signal name; using SIGUSR2", OTELPROF_TRIGGER_SIGNAL, raw)
        number = getattr(signal, "SIGUSR2", None)
    if number is None or signal.getsignal(number) not in (signal.SIG_DFL, None):
        return None  # the program handles it itself (or the platform has no such signal)
    return int(number)


def _factor(environ: Mapping[str, str]) -> float:
    raw = environ.get(OTELPROF_ANOMALY_FACTOR, "").strip()
    if not raw:
        return 3.0
    try:
        value = float(raw)
        if not (value == 0 or 1 < value < 1e6):
            raise ValueError
    except ValueError:
        _log.warning("%s=%r is not 0 or a number above 1; using 3", OTELPROF_ANOMALY_FACTOR, raw)
        return 3.0
    return value
