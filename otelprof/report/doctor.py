"""``otelprof doctor``'s checks: why nothing shows up, one line each.

Every check returns a :class:`Check`; none raises. The export check makes a real, empty
``Export`` call with the configured protocol, endpoint, TLS and headers, so reachability, TLS
and credentials are tested exactly as the exporter will meet them.
"""

from __future__ import annotations

import errno
import http.client
import logging
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..export.config import ExporterConfig, exporter_config_from_env
from ..export.redact import redact_headers, redact_url
from ..settings import quoted

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, warn, fail or skip (not applicable here)
    message: str


@dataclass(frozen=True)
class Setting:
    """One variable: its value as given (secrets masked), or None when unset, and its default."""

    name: str
    value: str | None
    default: str


# --- configuration ---------------------------------------------------------------------------


def known_variables() -> dict[str, str]:
    """Every variable of the settings registry with its default, as ``doctor`` prints it."""
    from ..settings import VARIABLES

    return {name: var.unset_means or _plain(var.default_text) for name, var in VARIABLES.items()}


def _plain(default: str) -> str:
    """A default without markup or the explanation that follows it in parentheses."""
    plain = re.sub(r" \(.*?\)", "", default.replace("``", ""))
    return "" if plain == "unset" else plain


def mask(name: str, value: str) -> str:
    """Header values, URL user info (user name too: often a token) and URL queries are
    credentials: only header names, hosts and paths are shown; a token is never shown."""
    if name.endswith(("_TOKEN", "_PASSWORD", "_SECRET")):
        return "***"
    if name.endswith("_HEADERS"):
        return redact_headers(value)
    if name.endswith("_ENDPOINT") or "://" in value:
        return redact_url(value)
    return value


def settings(environ: Mapping[str, str]) -> list[Setting]:
    """The known variables (set or not) and any unknown ``OTELPROF_*`` one, sorted by name."""
    known = known_variables()
    out = [Setting(name, _given(environ, name), default) for name, default in known.items()]
    out += [
        Setting(name, _given(environ, name), "")
        for name in environ
        if name.startswith("OTELPROF_") and name not in known
    ]
    return sorted(out, key=lambda s: s.name)


#: Longest value doctor shows as given; a longer one, or one with control characters, is quoted
#: as warnings quote it (escaped, cut short): a 100k-character value is no help on a line.
SHOWN_CHARS = 300


def _shown(text: str) -> str:
    return text if text.isprintable() and len(text) <= SHOWN_CHARS else quoted(text)


def _given(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "")
    # masked first: a value cut short could keep part of a secret the mask would have hidden
    return _shown(mask(name, value)) if value.strip() else None


@contextmanager
def _captured_warnings() -> Iterator[list[str]]:
    """Warnings otelprof logs while it reads the environment (a bad value, the default used),
    collected and not printed: doctor reports each once, as a check line."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("otelprof")
    handlers, saved, propagate = logger.handlers[:], logger.level, logger.propagate
    logger.handlers = [Collect(logging.WARNING)]  # not also the command line's stderr handler
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield lines
    finally:
        logger.handlers = handlers
        logger.setLevel(saved)
        logger.propagate = propagate


def check_configuration(environ: Mapping[str, str]) -> list[Check]:
    """Reads the environment as otelprof will: each bad value (and unknown OTELPROF_ name) is a warning."""
    from ..capture.config import settings_from_env
    from ..export.exporter import spool_dir_from_env
    from ..resource import options_from_env

    with _captured_warnings() as warnings:
        exporter_config_from_env(environ)
        options_from_env(environ)
        settings_from_env(environ)
        spool_dir_from_env(environ)
    known = known_variables()
    checks = [Check("config", WARN, line) for line in dict.fromkeys(warnings)]
    for name in sorted(environ):
        if name.startswith("OTELPROF_") and name not in known:
            checks.append(Check("config", WARN, f"{name} is not an otelprof variable (a typo?); ignored"))
    if not checks:
        checks.append(Check("config", OK, "every OTEL_* and OTELPROF_* value otelprof reads is valid"))
    return checks


# --- export ----------------------------------------------------------------------------------


def check_export(environ: Mapping[str, str], timeout_s: float = 5.0) -> Check:
    """A real, empty Export call to the configured endpoint."""
    import dataclasses

    from ..export.config import why_no_endpoint
    from ..export.exporter import transport

    with _captured_warnings():  # already reported by check_configuration
        cfg = exporter_config_from_env(environ)
    if cfg.disabled:
        return Check("export", WARN, "OTEL_SDK_DISABLED=true: nothing is exported")
    if not cfg.endpoint_configured:
        return Check("export", WARN, f"no endpoint: {why_no_endpoint(environ)}, so spans only go to the spool")
    cfg = dataclasses.replace(cfg, timeout_s=min(cfg.timeout_s, timeout_s))
    where = f"{cfg.protocol} {_shown(redact_url(cfg.url))}"
    send, close = transport(cfg)
    started = time.perf_counter()
    try:
        result = send(b"")  # an empty ExportTraceServiceRequest
    except Exception as exc:  # a transport bug: its message may quote a header, so the type only
        return Check("export", FAIL, f"{where}: the export raised {type(exc).__name__} (an otelprof bug)")
    finally:
        close()
    elapsed_ms = (time.perf_counter() - started) * 1000
    if result.ok:
        tls = "no TLS" if cfg.insecure else "TLS"
        headers = ", ".join(cfg.header_names) or "none"
        return Check(
            "export", OK, f"{where} accepted an empty export in {elapsed_ms:.0f} ms ({tls}; headers: {headers})"
        )
    message = "".join(c if c.isprintable() else "?" for c in result.message)[:300]  # binary answers
    return Check("export", FAIL, f"{where}: {message}{_hint(cfg, result.message)}")


def _hint(cfg: ExporterConfig, message: str) -> str:
    """What a failure most likely means, from the transport's message."""
    text = message.lower()
    headers = ", ".join(cfg.header_names) or "none"
    if "http 401" in text or "http 403" in text or "unauthenticated" in text or "permission_denied" in text:
        return f" -> the receiver refused the credentials: check OTEL_EXPORTER_OTLP_HEADERS (sent: {headers})"
    if "certificate_verify_failed" in text or "certificate verify failed" in text:
        return " -> the server's certificate is not trusted: set OTEL_EXPORTER_OTLP_CERTIFICATE to its CA (PEM)"
    if "wrong_version_number" in text or "wrong version number" in text or "record_layer_failure" in text:
        return " -> the receiver does not speak TLS here: use an http:// endpoint"
    if "certificate required" in text or "certificate_required" in text or "handshake failure" in text:
        return " -> the receiver wants a client certificate: set OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY"
    if "http 404" in text:
        return " -> no OTLP traces path there: HTTP appends v1/traces to OTEL_EXPORTER_OTLP_ENDPOINT (a base URL)"
    if "http1.x server" in text or "failed parsing http/2" in text or "alpn" in text:
        return " -> that is an HTTP port: set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (or use the gRPC port, 4317)"
    if "badstatusline" in text:
        return " -> the answer is not HTTP/1.1: a gRPC port? set OTEL_EXPORTER_OTLP_PROTOCOL=grpc (or use port 4318)"
    if "refused" in text:
        return " -> nothing listens there: is the Collector running? (OTLP/gRPC is port 4317, OTLP/HTTP 4318)"
    if "timed out" in text or "deadline_exceeded" in text or "timeout" in text:
        return " -> no answer in time: a firewall, a wrong host, or an overloaded receiver"
    if "remotedisconnected" in text or "connection reset" in text or "socket closed" in text:
        if cfg.protocol == "grpc":
            return " -> the connection was closed: does the receiver need TLS (https://) or is it an HTTP port?"
        return " -> the connection was closed: does the receiver need TLS (https://), or is it a gRPC port?"
    return ""


# --- Prometheus ------------------------------------------------------------------------------


def _why(exc: OSError | UnicodeError) -> str:
    """An error's reason, short: its strerror (an OSError's message may repeat a long path)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return quoted(str(exc))  # a UnicodeError's quotes the text it could not encode


def check_prometheus(environ: Mapping[str, str], timeout_s: float = 2.0) -> Check:
    """Whether the /metrics endpoint can listen where it is configured to. The host and port
    are the registry's; whatever the system makes of them (no such address family, a name the
    IDNA codec refuses) is a failed line, not a traceback."""
    from ..capture.config import settings_from_env

    with _captured_warnings():
        config = settings_from_env(environ)
    host, port = config.metrics_host, config.metrics_port
    if not config.enabled:
        return Check("prometheus", SKIP, "instrumentation is off (OTELPROF_ENABLED / OTEL_SDK_DISABLED)")
    if port == 0:
        return Check("prometheus", OK, f"port 0: /metrics picks a free port on {host} at start (logged)")
    address = f"{host}:{port}"
    try:
        return _listen_check(host, port, address, timeout_s)
    except (OSError, UnicodeError) as exc:
        return Check(
            "prometheus", FAIL, f"{address}: cannot listen there ({_why(exc)}): set OTEL_EXPORTER_PROMETHEUS_HOST"
        )


def _listen_check(host: str, port: int, address: str, timeout_s: float) -> Check:
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as exc:
        return Check(
            "prometheus", FAIL, f"{address}: cannot resolve {host!r} ({_why(exc)}): set OTEL_EXPORTER_PROMETHEUS_HOST"
        )
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server binds
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return Check("prometheus", FAIL, f"{address}: cannot listen there ({exc.strerror or exc})")
        else:
            return Check("prometheus", OK, f"{address} is free for /metrics (each local rank adds its rank)")
    served = _scrape(host, port, timeout_s)
    if served is not None and "otelprof_" in served:
        return Check("prometheus", OK, f"{address}: an otelprof /metrics endpoint already answers (a running job)")
    what = "an HTTP server" if served is not None else "another program"
    return Check(
        "prometheus",
        FAIL,
        f"{address} is taken by {what}: otelprof could not serve /metrics; set OTEL_EXPORTER_PROMETHEUS_PORT",
    )


def _scrape(host: str, port: int, timeout_s: float) -> str | None:
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        return response.read(1 << 20).decode("utf-8", "replace") if response.status == 200 else ""
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


# --- torch, CUDA, CUPTI ------------------------------------------------------------------------


def check_torch() -> list[Check]:
    """torch is optional: converting, summarising and importing work without it."""
    try:
        import torch
    except ImportError:
        return [
            Check(
                "torch",
                SKIP,
                "not installed: convert, summary and spool work; live capture and demo need it "
                "(pip install 'otelprof[torch]')",
            )
        ]
    cuda_build = torch.version.cuda
    checks = [Check("torch", OK, f"torch {torch.__version__} ({f'CUDA {cuda_build}' if cuda_build else 'CPU'} build)")]
    if not cuda_build:
        checks.append(Check("cuda", SKIP, "a CPU build of torch: CPU operators only, no kernels"))
        return checks
    if not torch.cuda.is_available():
        checks.append(Check("cuda", WARN, "a CUDA build of torch, but no usable GPU (driver, CUDA_VISIBLE_DEVICES?)"))
        return checks
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    checks.append(Check("cuda", OK, f"{torch.cuda.device_count()} GPU(s): {', '.join(names)}"))
    checks.append(_check_cupti())
    return checks


def _check_cupti() -> Check:
    """Profiles one tiny kernel: CUPTI works when torch.profiler records it with device time."""
    import torch as t
    from torch.profiler import ProfilerActivity, profile

    if ProfilerActivity.CUDA not in t.profiler.supported_activities():  # type: ignore[no-untyped-call]  # unannotated in torch
        return Check("cupti", FAIL, "torch.profiler cannot trace CUDA (CUPTI missing): kernels will not be recorded")
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            (t.ones(256, device="cuda") * 2).sum().item()
            t.cuda.synchronize()
        device_us = sum(evt.self_device_time_total for evt in prof.key_averages())
    except Exception as exc:  # a profiler that cannot start says why here
        return Check("cupti", FAIL, f"torch.profiler with CUDA failed: {type(exc).__name__}: {exc}")
    if device_us <= 0:
        return Check(
            "cupti",
            FAIL,
            "torch.profiler recorded no kernel time: CUPTI may lack permission (NVreg_RestrictProfilingToAdminUsers)",
        )
    return Check("cupti", OK, f"torch.profiler records CUDA kernels ({device_us:.1f} us in a test kernel)")


# --- native core, spool ----------------------------------------------------------------------


def check_native() -> Check:
    from ..converter import native_available

    if native_available():
        return Check("native", OK, "the C++ core (otelprof._native) is loaded")
    return Check("native", WARN, "otelprof._native is not built: conversion uses the slower Python reference")


def check_spool(environ: Mapping[str, str]) -> Check:
    """The spool folder and what waits in it. A folder the system cannot look at (a path
    through a link to a name too long, a permission) is a failed line, not a traceback."""
    from ..export.exporter import spool_dir_from_env

    with _captured_warnings():  # already reported by check_configuration
        folder = spool_dir_from_env(environ)
    try:
        return _spool_check(environ, folder)
    except (OSError, UnicodeError) as exc:
        return Check("spool", FAIL, f"{quoted(str(folder))}: cannot read it ({_why(exc)}): set OTELPROF_SPOOL_DIR")


def _spool_check(environ: Mapping[str, str], folder: Path) -> Check:
    from ..export.spool import DEFAULT_MAX_BYTES, SUFFIX, folder_problem

    problem = folder_problem(folder)
    if problem is not None:
        return Check("spool", FAIL, problem)
    if not folder.exists():
        parent = next((p for p in folder.parents if p.exists()), None)
        if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
            return Check("spool", FAIL, f"{folder} does not exist and {parent} is not writable")
        return Check("spool", OK, f"{folder}: empty (created when first needed)")
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        return Check("spool", FAIL, f"{folder} is not a writable folder: set OTELPROF_SPOOL_DIR")
    from ..export.destination import NO_DESTINATION, destination_id
    from ..export.spool import record_destination

    sizes: list[int] = []
    per_destination: Counter[str] = Counter()
    for record in folder.glob(f"*{SUFFIX}"):
        try:
            sizes.append(record.stat().st_size)
        except FileNotFoundError:  # replayed meanwhile
            continue
        per_destination[record_destination(record) or NO_DESTINATION] += 1
    total = sum(sizes)
    if not sizes:
        return Check("spool", OK, f"{folder}: empty")
    with _captured_warnings():
        cfg = exporter_config_from_env(environ)
    # a job replays only the records of its own destination; the others wait for `spool replay`
    mine = per_destination.pop(destination_id(cfg), 0) if cfg.endpoint_configured else 0
    unnamed = per_destination.pop(NO_DESTINATION, 0)
    parts = []
    if mine:
        parts.append(f"{mine} for this endpoint (a job exporting there replays them once it answers)")
    if unnamed:
        parts.append(
            f"{unnamed} naming no destination (spooled with no endpoint set, or by an older otelprof): "
            f"no job replays them, `otelprof spool replay{'' if cfg.endpoint_configured else ' --endpoint URL'}` "
            "sends them"
        )
    if per_destination:
        parts.append(
            f"{sum(per_destination.values())} for {len(per_destination)} other destination(s) "
            f"({', '.join(sorted(per_destination))}: `otelprof spool replay --destination ID` sends them)"
        )
    hint = "; ".join(parts)
    if total > 0.9 * DEFAULT_MAX_BYTES:
        hint = "nearly full, the oldest requests are evicted next: " + hint
    return Check("spool", WARN, f"{folder}: {len(sizes)} requests ({total} bytes) waiting: {hint}")


def run_checks(environ: Mapping[str, str], timeout_s: float = 5.0, torch: bool = True) -> list[Check]:
    """Every check, each on its own: one that raises (a bug) is a failed line, not a traceback."""
    runs: list[tuple[str, Callable[[], Check | list[Check]]]] = [
        ("config", lambda: check_configuration(environ)),
        ("export", lambda: check_export(environ, timeout_s)),
        ("prometheus", lambda: check_prometheus(environ, min(timeout_s, 2.0))),
        ("native", check_native),
    ]
    if torch:
        runs.append(("torch", check_torch))
    runs.append(("spool", lambda: check_spool(environ)))
    checks: list[Check] = []
    for name, run in runs:
        try:
            found = run()
        except Exception as exc:  # the message may quote a configured value: the type only
            found = Check(name, FAIL, f"the check raised {type(exc).__name__} (an otelprof bug)")
        checks.extend(found if isinstance(found, list) else [found])
    return checks
