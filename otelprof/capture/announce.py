"""The one stderr line an instrumented process writes when its session starts (the first step
begins): where spans and metrics go and when windows profile, credentials masked.

Written then, not at ``instrument()``: the rank (torch.distributed's) and the /metrics port
(``0`` picks a free one) are only known once the session has started. Local rank 0 writes it,
so a node's log has it once; ``OTELPROF_QUIET=true`` (``otelprof run -q``) silences it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ..export.config import ExporterConfig
from ..export.redact import redact_url
from ..settings import text, value
from ..settings.variables import OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL, OTELPROF_QUIET

if TYPE_CHECKING:  # windows/ imports this module (window_line)
    from .windows.profiling import WindowSettings

_log = logging.getLogger(__name__)


def quiet(environ: Mapping[str, str]) -> bool:
    return bool(value(environ, OTELPROF_QUIET, _log))


#: A value longer than this is cut (a 100k-character setting must not make a 100k-character line).
SHOWN_CHARS = 120


def _shown(raw: str) -> str:
    """A value from the environment as the line shows it: one line (control characters escaped),
    cut short with its length said. Credentials are masked before (a cut could keep a part)."""
    one = raw if raw.isprintable() else repr(raw)[1:-1]
    return one if len(one) <= SHOWN_CHARS else f"{one[:SHOWN_CHARS]}... ({len(one)} characters)"


def _home(path: Path, cut: bool = True) -> str:
    home = os.path.expanduser("~")
    shown = str(path)
    if home not in ("", "/") and shown.startswith(home + os.sep):
        shown = "~" + shown[len(home) :]
    return _shown(shown) if cut else shown


def spans_part(config: ExporterConfig, spool: Path, otlp: bool = True, sdk: Sequence[object] = ()) -> str:
    """``otlp``: otelprof's own OTLP path sends spans; ``sdk``: the OpenTelemetry SDK span
    processors that also get them (export/sdk_route.py), named by their exporters."""
    via = ", ".join(sorted({type(getattr(p, "span_exporter", None) or p).__name__ for p in sdk}))
    sdk_shown = f"SDK exporters {via}" if via else ""
    if not otlp:
        return f"spans → {sdk_shown or 'nowhere (OTEL_TRACES_EXPORTER=none)'}"
    also = f" and {sdk_shown}" if sdk_shown else ""
    if not config.endpoint_configured:
        return (
            f"spans → spool {_home(spool)} (no OTEL_EXPORTER_OTLP_ENDPOINT; `otelprof spool replay` sends them){also}"
        )
    return f"spans → {_shown(redact_url(config.url))} ({config.protocol}) | spool {_home(spool)}{also}"


def _otlp_metrics_url(environ: Mapping[str, str]) -> str:
    """Where the OpenTelemetry SDK's metric exporter sends, as the specification has it."""
    protocol = text(environ, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL) or text(environ, OTEL_EXPORTER_OTLP_PROTOCOL)
    grpc = protocol == "grpc"
    specific = (environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or "").strip()
    general = (environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    if specific:
        url = specific
    elif general:
        url = general if grpc else general.rstrip("/") + "/v1/metrics"
    else:
        url = "http://localhost:4317" if grpc else "http://localhost:4318/v1/metrics"
    return f"{_shown(redact_url(url))} ({'grpc' if grpc else 'http/protobuf'})"


def metrics_part(
    exporters: set[str], host: str, port: int | None, environ: Mapping[str, str], world_size: int = 1
) -> str:
    """``port``: the port /metrics is served on (None: it is not)."""
    shown = []
    if port is not None:
        where = _shown(f"[{host}]" if ":" in host else host)
        per_rank = " (each local rank: port + local rank)" if world_size > 1 else ""
        shown.append(f"http://{where}:{port}/metrics{per_rank}")
    elif "prometheus" in exporters:
        shown.append("/metrics not served (see the warning above)")
    if "otlp" in exporters:
        shown.append(_otlp_metrics_url(environ))
    return "metrics → " + (" and ".join(shown) if shown else "none (OTEL_METRICS_EXPORTER=none)")


def windows_part(windows: WindowSettings, http_trigger: bool) -> str:
    if not windows.enabled:
        return "windows: off (OTELPROF_PROFILE=false)"
    cycle = windows.wait + windows.warmup + windows.active
    times = "forever" if windows.repeat == 0 else f"{windows.repeat}x"
    parts = [f"{windows.active} steps of every {cycle} after the first {windows.skip_first}, {times}"]
    if windows.early and windows.early + windows.warmup + windows.active <= windows.skip_first + windows.wait:
        parts.append(f"an early one {windows.early} steps in")  # Windows._early_fits
    demand = ["POST /profile"] if http_trigger else []
    if windows.trigger_signal is not None:
        import signal

        demand.append(signal.Signals(windows.trigger_signal).name)
    if windows.trigger_file:
        demand.append(f"file {_shown(windows.trigger_file)}")
    return "windows: " + ", ".join(parts) + "; on demand: " + (", ".join(demand) or "off")


def _steps(numbers: list[int]) -> str:
    if not numbers:
        return "no step"
    first, last = min(numbers), max(numbers)
    return f"step {first}" if first == last else f"steps {first}-{last}"


def window_line(trigger: str, steps: list[int], spans: int, kept: Path | None) -> str:
    """The line written when a window of otelprof's own has been converted and handed to the
    exporter: which steps, why, how many spans, and where its raw trace was kept."""
    raw = f"; raw trace {_home(kept, cut=False)}" if kept is not None else ""  # a name of ours, whole
    return f"otelprof: profiled {_steps(steps)} ({trigger} window): {spans} spans sent{raw}"


def write_line(line: str, stream: TextIO | None = None) -> None:
    """Writes one line to stderr; never raises (a closed stderr must not stop the job)."""
    try:
        out = stream or sys.stderr
        out.write(line + "\n")
        out.flush()
    except (OSError, ValueError, AttributeError):
        pass


def announce(
    spans: str,
    metrics: str,
    windows: WindowSettings,
    http_trigger: bool,
    stream: TextIO | None = None,
) -> None:
    """Writes the line; never raises (a closed stderr must not stop the job)."""
    write_line(f"otelprof: {spans}; {metrics}; {windows_part(windows, http_trigger)}", stream)
