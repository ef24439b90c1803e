"""OTLP exporter settings from the environment, exactly as the OpenTelemetry specification
defines them (``OTEL_EXPORTER_OTLP_*``; a ``TRACES_`` variable replaces its general one).

A bad value never raises: one warning names the variable and the value used instead. Header
values (they carry credentials) are never logged or shown in ``repr``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from .. import environment_variables as ev
from ..settings import first_set, text, value

_log = logging.getLogger(__name__)

Protocol = Literal["grpc", "http/protobuf"]
Compression = Literal["gzip", "none"]

DEFAULT_PROTOCOL: Protocol = "http/protobuf"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "v1/traces"
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ExporterConfig:
    """Where and how spans are exported.

    ``url`` is the full traces URL for ``http/protobuf``, and ``scheme://host:port`` for ``grpc``
    (``target`` gives the ``host:port`` gRPC dials). ``endpoint_configured`` is False when no
    endpoint variable is set: the embedded default destination applies then.
    """

    protocol: Protocol = DEFAULT_PROTOCOL
    url: str = DEFAULT_HTTP_ENDPOINT + "/" + TRACES_PATH
    endpoint_configured: bool = False
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    compression: Compression = "none"
    timeout_s: float = DEFAULT_TIMEOUT_S
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    insecure: bool = True  # the default URL is plain http
    disabled: bool = False

    @property
    def target(self) -> str:
        """``host:port`` (gRPC's dial target)."""
        parts = urlsplit(self.url)
        return parts.netloc

    @property
    def header_names(self) -> tuple[str, ...]:
        """Header names only: safe to log."""
        return tuple(k for k, _ in self.headers)


def _get(environ: Mapping[str, str], traces_name: str, general_name: str) -> tuple[str, str] | None:
    """(variable, text) of the signal-specific variable if set, else of the general one."""
    name = first_set(environ, traces_name, general_name)
    found = text(environ, name) if name is not None else None
    return (name, found) if name is not None and found is not None else None


def _pick(environ: Mapping[str, str], traces_name: str, general_name: str) -> str:
    """The signal-specific variable when set, else the general one."""
    return first_set(environ, traces_name) or general_name


def _read(environ: Mapping[str, str], traces_name: str, general_name: str) -> Any:
    """The value of :func:`_pick`'s variable, parsed by the settings registry."""
    return value(environ, _pick(environ, traces_name, general_name), _log)


def sdk_disabled(environ: Mapping[str, str] = os.environ) -> bool:
    """``OTEL_SDK_DISABLED``, read the same way by the exporter and the instrumentor."""
    return bool(value(environ, ev.OTEL_SDK_DISABLED, _log))


def _protocol(environ: Mapping[str, str]) -> Protocol:
    protocol: Protocol = _read(environ, ev.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, ev.OTEL_EXPORTER_OTLP_PROTOCOL)
    return protocol


def endpoint_variable(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """(variable, value) of the endpoint variable that applies (``TRACES_`` first), or None."""
    return _get(environ, ev.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, ev.OTEL_EXPORTER_OTLP_ENDPOINT)


def why_no_endpoint(environ: Mapping[str, str] = os.environ) -> str:
    """Why an exporter has no endpoint, for messages: unset, or set to something unusable."""
    found = endpoint_variable(environ)
    if found is None:
        return "OTEL_EXPORTER_OTLP_ENDPOINT is unset"
    name, value = found
    return f"{name}={value!r} is not an http(s) URL"


def _url(environ: Mapping[str, str], protocol: Protocol) -> tuple[str, bool, bool | None]:
    """(url, endpoint_configured, TLS as the scheme says, or None when the endpoint has no scheme).

    Unset, otelprof has no endpoint (spans go to the spool; the README says why it does not
    assume the specification's localhost default). A value that is not a URL is treated as
    unset, after one warning: the same spool-only default, wherever the config is read.
    """
    default = DEFAULT_GRPC_ENDPOINT if protocol == "grpc" else DEFAULT_HTTP_ENDPOINT
    found = endpoint_variable(environ)
    if found is None:
        return _with_path(default, protocol, signal_specific=False), False, False
    name, raw = found
    specific = name == ev.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    parts = urlsplit(raw if "://" in raw else "//" + raw)
    scheme = parts.scheme.lower()
    bad_scheme = scheme not in ("", "http", "https") or (protocol != "grpc" and not scheme)
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number, or out of range
        port_ok = True
    except ValueError:
        port_ok = False
    if bad_scheme or not parts.hostname or not port_ok:
        _log.warning("%s=%r is not an http(s) URL; ignored: spans go to the spool, as with no endpoint", name, raw)
        return _with_path(default, protocol, signal_specific=False), False, False
    if protocol == "grpc":
        netloc = parts.netloc if parts.port else f"{parts.netloc}:{4317}"
        return f"{scheme or 'https'}://{netloc}", True, (scheme == "https") if scheme else None
    return _with_path(raw, protocol, signal_specific=specific), True, scheme == "https"


def _with_path(url: str, protocol: Protocol, signal_specific: bool) -> str:
    """HTTP: ``v1/traces`` is appended to the general endpoint's path; a signal-specific URL is
    used as is (with ``/`` when it has no path)."""
    if protocol == "grpc":
        return url
    parts = urlsplit(url)
    path = (parts.path or "/") if signal_specific else parts.path.rstrip("/") + "/" + TRACES_PATH
    return parts._replace(path=path).geturl()


def _headers(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    found = _get(environ, ev.OTEL_EXPORTER_OTLP_TRACES_HEADERS, ev.OTEL_EXPORTER_OTLP_HEADERS)
    if found is None:
        return ()
    name, raw = found
    headers: list[tuple[str, str]] = []
    for position, entry in enumerate(raw.split(","), start=1):
        key, sep, value = entry.partition("=")
        key = key.strip().lower()
        if not sep or not key or any(c.isspace() or not c.isprintable() for c in key):
            # the value may be a credential: say where, never what
            _log.warning("%s: entry %d is not key=value; skipped", name, position)
            continue
        headers.append((key, unquote(value.strip())))
    return tuple(headers)


def _compression(environ: Mapping[str, str]) -> Compression:
    compression: Compression = _read(
        environ, ev.OTEL_EXPORTER_OTLP_TRACES_COMPRESSION, ev.OTEL_EXPORTER_OTLP_COMPRESSION
    )
    return compression


def _timeout_s(environ: Mapping[str, str]) -> float:
    millis = _read(environ, ev.OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, ev.OTEL_EXPORTER_OTLP_TIMEOUT)
    return float(millis) / 1000


def _file(environ: Mapping[str, str], traces_name: str, general_name: str) -> str | None:
    name = _pick(environ, traces_name, general_name)
    path = value(environ, name, _log)
    if path is None:
        return None
    if not os.path.isfile(path):
        _log.warning("%s=%r is not a readable file; ignored", name, environ[name].strip())
        return None
    return str(path)


def exporter_config_from_env(environ: Mapping[str, str] = os.environ) -> ExporterConfig:
    protocol = _protocol(environ)
    url, configured, tls_from_scheme = _url(environ, protocol)
    # the INSECURE flag only decides for a gRPC endpoint given without a scheme
    insecure_flag = _read(environ, ev.OTEL_EXPORTER_OTLP_TRACES_INSECURE, ev.OTEL_EXPORTER_OTLP_INSECURE)
    insecure = insecure_flag if tls_from_scheme is None else not tls_from_scheme
    if tls_from_scheme is None:  # scheme-less gRPC endpoint: show the transport the flag chose
        url = ("http" if insecure else "https") + url[url.index("://") :]
    return ExporterConfig(
        protocol=protocol,
        url=url,
        endpoint_configured=configured,
        headers=_headers(environ),
        compression=_compression(environ),
        timeout_s=_timeout_s(environ),
        certificate=_file(environ, ev.OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, ev.OTEL_EXPORTER_OTLP_CERTIFICATE),
        client_key=_file(environ, ev.OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, ev.OTEL_EXPORTER_OTLP_CLIENT_KEY),
        client_certificate=_file(
            environ, ev.OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE, ev.OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE
        ),
        insecure=insecure,
        disabled=sdk_disabled(environ),
    )
