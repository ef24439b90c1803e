"""Which destination a spooled request was meant for, without keeping its secrets on disk.

A destination is the protocol, the URL and the headers (an MLflow experiment id, a tenant, an
auth token) of the exporter that spooled a request. Spool records carry a digest of all three,
so replay sends a record only where it was going; the spool keeps, in clear, only the protocol,
the URL without user info, query or fragment, and the header *names* (``describe``).
"""

from __future__ import annotations

import hashlib
from urllib.parse import urlsplit, urlunsplit

from .config import ExporterConfig

#: Records spooled with no endpoint configured: no destination yet; ``otelprof spool replay``
#: sends them wherever the user says.
NO_DESTINATION = "none"
ID_LENGTH = 16  # hex digits: 64 bits


def destination_id(cfg: ExporterConfig) -> str:
    """SHA-256 (truncated) over protocol, URL and headers, names and values."""
    if not cfg.endpoint_configured:
        return NO_DESTINATION
    h = hashlib.sha256(b"otelprof destination v1\0")
    for part in (cfg.protocol, cfg.url, *(f"{k}\0{v}" for k, v in sorted(cfg.headers))):
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:ID_LENGTH]


def is_destination_id(text: str) -> bool:
    return text == NO_DESTINATION or (len(text) == ID_LENGTH and all(c in "0123456789abcdef" for c in text))


def public_url(url: str) -> str:
    """The URL without user info, query or fragment (where credentials may hide)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host + (f":{port}" if port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def describe(cfg: ExporterConfig) -> dict[str, object]:
    """What ``otelprof spool ls`` shows for a destination: nothing secret."""
    return {"protocol": cfg.protocol, "endpoint": public_url(cfg.url), "headers": sorted(cfg.header_names)}
