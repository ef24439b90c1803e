"""What one export attempt came to, independent of the transport."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The longest a server may make the exporter wait (``Retry-After``, gRPC ``RetryInfo``): a
#: larger, infinite or far-future value means "wait long", not "stop exporting for good".
MAX_SERVER_DELAY_S = 300.0

#: ``ExportResult.problem``: a TLS file the configuration names is unusable (unreadable, not a
#: certificate or key). Nothing succeeds until it is fixed: the exporter spools at once, without
#: retries, and names it in one warning; a later run (or probe) with the file fixed sends it.
TLS_CONFIG = "tls_config"
#: ``ExportResult.problem``: the TLS handshake or session failed (an untrusted certificate, an
#: ``https://`` endpoint that speaks plain HTTP, ...): retryable as usual, named in one warning.
TLS = "tls"


def server_delay(seconds: float | None, cap_s: float = MAX_SERVER_DELAY_S) -> float | None:
    """A delay a server asked for, made safe: NaN is no delay given (None), negative is 0, and
    anything above ``cap_s`` (infinity included) is ``cap_s``."""
    if seconds is None or math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), cap_s)


@dataclass(frozen=True)
class ExportResult:
    """``ok``: the receiver took the request (``rejected_spans`` of it may have been refused,
    with ``message``). Otherwise ``retryable`` says whether the specification allows sending
    the same request again, after ``retry_after_s`` when the receiver asked for a delay."""

    ok: bool
    retryable: bool = False
    retry_after_s: float | None = None
    rejected_spans: int = 0
    message: str = ""
    problem: str = ""  # TLS_CONFIG, TLS: a failure the exporter names in a warning of its own

    @classmethod
    def success(cls, rejected_spans: int = 0, message: str = "") -> ExportResult:
        return cls(True, rejected_spans=rejected_spans, message=message)
