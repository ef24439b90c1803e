"""What one export attempt came to, independent of the transport."""

from __future__ import annotations

from dataclasses import dataclass


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

    @classmethod
    def success(cls, rejected_spans: int = 0, message: str = "") -> ExportResult:
        return cls(True, rejected_spans=rejected_spans, message=message)
