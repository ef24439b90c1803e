"""The instrumentor's settings, parsed once from the environment through the settings registry
(otelprof/settings/variables.py). A bad value logs a warning naming it and the default applies."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..export.config import sdk_disabled
from ..settings import quoted, value
from ..settings.variables import (
    OTEL_EXPORTER_PROMETHEUS_HOST,
    OTEL_EXPORTER_PROMETHEUS_PORT,
    OTELPROF_ANOMALY_FACTOR,
    OTELPROF_CUDA_EVENTS,
    OTELPROF_ENABLED,
    OTELPROF_ON_DEMAND_STEPS,
    OTELPROF_PROFILE,
    OTELPROF_PROFILE_ACTIVE,
    OTELPROF_PROFILE_EARLY,
    OTELPROF_PROFILE_MAX_STEPS,
    OTELPROF_PROFILE_MIN_INTERVAL,
    OTELPROF_PROFILE_OPTIONS,
    OTELPROF_PROFILE_REPEAT,
    OTELPROF_PROFILE_SKIP_FIRST,
    OTELPROF_PROFILE_TOKEN,
    OTELPROF_PROFILE_WAIT,
    OTELPROF_PROFILE_WARMUP,
    OTELPROF_TRIGGER_FILE,
    OTELPROF_TRIGGER_HTTP,
    OTELPROF_TRIGGER_SIGNAL,
)
from .metrics.server import TriggerGuard
from .windows.keep import keep_from_env
from .windows.profiling import WindowSettings

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    enabled: bool = True
    metrics_host: str = "localhost"
    metrics_port: int = 9464
    http_trigger: bool = True
    trigger: TriggerGuard = field(default_factory=TriggerGuard)  # POST /profile's token and limits
    cuda_events: bool = True
    windows: WindowSettings = field(default_factory=WindowSettings)
    #: ``OTEL_SDK_DISABLED`` as read here: the session's exporter takes it (read once, warned once)
    sdk_disabled: bool = False


def settings_from_env(environ: Mapping[str, str] = os.environ) -> Settings:
    enabled = value(environ, OTELPROF_ENABLED, _log)
    disabled = sdk_disabled(environ)
    return Settings(
        enabled=enabled and not disabled,
        sdk_disabled=disabled,
        metrics_host=value(environ, OTEL_EXPORTER_PROMETHEUS_HOST, _log),
        metrics_port=value(environ, OTEL_EXPORTER_PROMETHEUS_PORT, _log),
        http_trigger=value(environ, OTELPROF_TRIGGER_HTTP, _log),
        trigger=TriggerGuard(
            token=value(environ, OTELPROF_PROFILE_TOKEN, _log),
            min_interval_s=value(environ, OTELPROF_PROFILE_MIN_INTERVAL, _log),
            max_steps=value(environ, OTELPROF_PROFILE_MAX_STEPS, _log),
        ),
        cuda_events=value(environ, OTELPROF_CUDA_EVENTS, _log),
        windows=windows_from_env(environ),
    )


def windows_from_env(environ: Mapping[str, str]) -> WindowSettings:
    options = dict.fromkeys(value(environ, OTELPROF_PROFILE_OPTIONS, _log), True)
    return WindowSettings(
        enabled=value(environ, OTELPROF_PROFILE, _log),
        skip_first=value(environ, OTELPROF_PROFILE_SKIP_FIRST, _log),
        wait=value(environ, OTELPROF_PROFILE_WAIT, _log),
        warmup=value(environ, OTELPROF_PROFILE_WARMUP, _log),
        active=value(environ, OTELPROF_PROFILE_ACTIVE, _log),
        repeat=value(environ, OTELPROF_PROFILE_REPEAT, _log),
        early=value(environ, OTELPROF_PROFILE_EARLY, _log),
        trigger_file=value(environ, OTELPROF_TRIGGER_FILE, _log),
        trigger_signal=_signal(environ),
        on_demand_steps=value(environ, OTELPROF_ON_DEMAND_STEPS, _log),
        anomaly_factor=value(environ, OTELPROF_ANOMALY_FACTOR, _log),
        keep=keep_from_env(environ),
        **options,
    )


def _signal(environ: Mapping[str, str]) -> int | None:
    import signal

    given = value(environ, OTELPROF_TRIGGER_SIGNAL, _log)
    raw = given.upper()
    if raw == "NONE":
        return None
    # signals only: the module's other integers (SIG_DFL, SIG_BLOCK) made getsignal() raise;
    # KILL and STOP cannot be handled (signal.signal() raised when the windows started)
    number = signal.Signals.__members__.get(raw if raw.startswith("SIG") else "SIG" + raw)
    if number is None or number.name in ("SIGKILL", "SIGSTOP"):
        _log.warning("%s=%s is not a signal a handler can take; using SIGUSR2", OTELPROF_TRIGGER_SIGNAL, quoted(given))
        number = getattr(signal, "SIGUSR2", None)
    if number is None or signal.getsignal(number) not in (signal.SIG_DFL, None):
        return None  # the program handles it itself (or the platform has no such signal)
    return int(number)
