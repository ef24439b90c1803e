"""OTLP exporter settings from the environment, exactly as the OpenTelemetry specification
defines them (``OTEL_EXPORTER_OTLP_*``; a ``TRACES_`` variable replaces its general one).

A bad value never raises: one warning names the variable and the value used instead. Header
values and URL user info (they carry credentials) are never logged or shown in ``repr``: user
info leaves the URL and becomes an ``authorization: Basic`` header (RFC 7617), and a header that
could not be sent as given (a control character, a name that is not a token) is refused here,
naming the header, rather than failing each request later with its value in the error.
"""

from __future__ import annotations

import base64
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from ..settings import EntryWarnings, first_set, is_utf8, quoted, text, value
from ..settings import variables as ev
from .redact import HEADER_NAME, redact_url

_log = logging.getLogger(__name__)

Protocol = Literal["grpc", "http/protobuf"]
Compression = Literal["gzip", "none"]

DEFAULT_PROTOCOL: Protocol = "http/protobuf"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "v1/traces"
#: The OTLP/HTTP path of the profiles signal while it is in development (the Collector's
#: otlpreceiver serves it there; gRPC: ``ProfilesService/Export`` on the same port as traces).
PROFILES_PATH = "v1development/profiles"
DEFAULT_TIMEOUT_S = 10.0
#: What both transports can send as a header value: gRPC metadata is printable ASCII only, and
#: http.client refuses CR/LF (and cannot encode most non-ASCII text).
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")
#: gRPC metadata keys (lowercase); ``-bin`` keys want bytes, not text.
_GRPC_KEY = re.compile(r"[0-9a-z_.-]+")


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
    signal: Literal["traces", "profiles"] = "traces"  # what the requests are: the gRPC method

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
    """Why an exporter has no endpoint, for messages: unset, or set to something unusable.
    Logs nothing: reading the exporter's config warned about the value already."""
    name = first_set(environ, ev.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, ev.OTEL_EXPORTER_OTLP_ENDPOINT)
    if name is None:
        return "OTEL_EXPORTER_OTLP_ENDPOINT is unset"
    raw = environ[name].strip()
    if not is_utf8(raw):
        return f"{name} has bytes that are not UTF-8"
    return f"{name}={_shown_url(raw)} is not an http(s) URL"


def _shown_url(raw: str) -> str:
    """An endpoint as messages show it: credentials masked first, then cut short (a cut could
    leave part of a secret unmasked)."""
    return quoted(redact_url(raw))


def _url(environ: Mapping[str, str], protocol: Protocol) -> tuple[str, bool, bool | None, str]:
    """(url without user info, endpoint_configured, TLS as the scheme says (None when the
    endpoint has no scheme), the URL's user info or "").

    Unset, otelprof has no endpoint (spans go to the spool; docs/exporting.md says why it does not
    assume the specification's localhost default). A value that is not a URL is treated as
    unset, after one warning: the same spool-only default, wherever the config is read.
    """
    default = DEFAULT_GRPC_ENDPOINT if protocol == "grpc" else DEFAULT_HTTP_ENDPOINT
    found = endpoint_variable(environ)
    if found is None:
        return _with_path(default, protocol, signal_specific=False), False, False, ""
    name, raw = found
    specific = name == ev.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    try:
        parts = urlsplit(raw if "://" in raw else "//" + raw)  # raises for "http://[::1"
        parts.port  # noqa: B018 - raises for a port that is not a number, or out of range
    except ValueError:
        parts = None
    scheme = parts.scheme.lower() if parts else ""
    bad_scheme = scheme not in ("", "http", "https") or (protocol != "grpc" and not scheme)
    if parts is None or bad_scheme or not parts.hostname:
        _log.warning(
            "%s=%s is not an http(s) URL; ignored: spans go to the spool, as with no endpoint", name, _shown_url(raw)
        )
        return _with_path(default, protocol, signal_specific=False), False, False, ""
    userinfo, _, host_port = parts.netloc.rpartition("@")
    parts = parts._replace(netloc=host_port)
    if protocol == "grpc":
        netloc = host_port if parts.port else f"{host_port}:{4317}"
        return f"{scheme or 'https'}://{netloc}", True, (scheme == "https") if scheme else None, userinfo
    return _with_path(parts.geturl(), protocol, signal_specific=specific), True, scheme == "https", userinfo


def _with_path(url: str, protocol: Protocol, signal_specific: bool) -> str:
    """HTTP: ``v1/traces`` is appended to the general endpoint's path; a signal-specific URL is
    used as is (with ``/`` when it has no path)."""
    if protocol == "grpc":
        return url
    parts = urlsplit(url)
    path = (parts.path or "/") if signal_specific else parts.path.rstrip("/") + "/" + TRACES_PATH
    return parts._replace(path=path).geturl()


def _headers(environ: Mapping[str, str], protocol: Protocol) -> tuple[tuple[str, str], ...]:
    found = _get(environ, ev.OTEL_EXPORTER_OTLP_TRACES_HEADERS, ev.OTEL_EXPORTER_OTLP_HEADERS)
    if found is None:
        return ()
    name, raw = found
    headers: list[tuple[str, str]] = []
    # values may be credentials, and so may a "name" with a mistyped separator in it:
    # messages say where, never what
    skipped = EntryWarnings(_log)
    for position, entry in enumerate(raw.split(","), start=1):
        key, sep, value = entry.partition("=")
        key, value = key.strip(), unquote(value.strip())
        lower = key.lower()  # as sent; checked before: "\u212a".lower() is "k"
        if not sep or not key:
            skipped.warn("%s: entry %d is not key=value; skipped", name, position)
        elif not HEADER_NAME.fullmatch(key):
            skipped.warn("%s: entry %d: the header name is not an HTTP token; skipped", name, position)
        elif protocol == "grpc" and (not _GRPC_KEY.fullmatch(lower) or lower.endswith("-bin")):
            skipped.warn(
                "%s: header %s is not a gRPC text metadata key (a-z 0-9 - _ .; no -bin); skipped", name, quoted(lower)
            )
        elif not _HEADER_VALUE.fullmatch(value):
            skipped.warn(
                "%s: header %s has a control or non-ASCII character in its value; skipped", name, quoted(lower)
            )
        else:
            headers.append((lower, value))
    skipped.done()
    return tuple(headers)


def _with_credentials(
    environ: Mapping[str, str], headers: tuple[tuple[str, str], ...], userinfo: str
) -> tuple[tuple[str, str], ...]:
    """The URL's ``user:password`` as an ``authorization: Basic`` header (RFC 7617: UTF-8,
    percent-decoded; a user name alone is ``user:``), unless a header already authorizes."""
    if not userinfo:
        return headers
    if any(key == "authorization" for key, _ in headers):
        _log.warning(
            "%s has credentials and %s sets authorization: the header is sent, the URL's credentials are not",
            _pick(environ, ev.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, ev.OTEL_EXPORTER_OTLP_ENDPOINT),
            _pick(environ, ev.OTEL_EXPORTER_OTLP_TRACES_HEADERS, ev.OTEL_EXPORTER_OTLP_HEADERS),
        )
        return headers
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return (*headers, ("authorization", f"Basic {token}"))


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
        _log.warning("%s=%s is not a readable file; ignored", name, quoted(environ[name].strip()))
        return None
    return str(path)


def exporter_config_from_env(
    environ: Mapping[str, str] = os.environ, *, disabled: bool | None = None
) -> ExporterConfig:
    """``disabled``: ``OTEL_SDK_DISABLED`` as the caller already read it (the instrumentor's
    settings), so that its warning is not repeated; None reads it here."""
    protocol = _protocol(environ)
    url, configured, tls_from_scheme, userinfo = _url(environ, protocol)
    # the INSECURE flag only decides for a gRPC endpoint given without a scheme
    insecure_flag = _read(environ, ev.OTEL_EXPORTER_OTLP_TRACES_INSECURE, ev.OTEL_EXPORTER_OTLP_INSECURE)
    insecure = insecure_flag if tls_from_scheme is None else not tls_from_scheme
    if tls_from_scheme is None:  # scheme-less gRPC endpoint: show the transport the flag chose
        url = ("http" if insecure else "https") + url[url.index("://") :]
    return ExporterConfig(
        protocol=protocol,
        url=url,
        endpoint_configured=configured,
        headers=_with_credentials(environ, _headers(environ, protocol), userinfo),
        compression=_compression(environ),
        timeout_s=_timeout_s(environ),
        certificate=_file(environ, ev.OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, ev.OTEL_EXPORTER_OTLP_CERTIFICATE),
        client_key=_file(environ, ev.OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, ev.OTEL_EXPORTER_OTLP_CLIENT_KEY),
        client_certificate=_file(
            environ, ev.OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE, ev.OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE
        ),
        insecure=insecure,
        disabled=sdk_disabled(environ) if disabled is None else disabled,
    )


def profiles_config(cfg: ExporterConfig, environ: Mapping[str, str] = os.environ) -> ExporterConfig:
    """The traces exporter's settings, sending profiles: gRPC to the same endpoint; HTTP to
    ``OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`` as is, else to the traces URL with its
    ``v1/traces`` path (or, for a signal-specific traces URL of another path, its end) replaced
    by ``v1development/profiles``."""
    url = cfg.url
    if cfg.protocol != "grpc":
        specific = text(environ, ev.OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT) if cfg.endpoint_configured else None
        # (credentials go in the headers, never in this URL: one with user info is not used)
        if specific and "://" in specific and urlsplit(specific).hostname and "@" not in urlsplit(specific).netloc:
            return replace(cfg, url=specific.strip(), signal="profiles")
        parts = urlsplit(url)
        path = parts.path
        base = path[: -len(TRACES_PATH)] if path.endswith(TRACES_PATH) else path.rstrip("/").rpartition("/")[0] + "/"
        url = parts._replace(path=base + PROFILES_PATH).geturl()
    return replace(cfg, url=url, signal="profiles")
