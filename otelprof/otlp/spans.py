"""The span model's plain types: a span, its attributes, its events and links.

Both the reference converter and the live step spans build these; ``encoder.encode`` turns
them into ``ExportTraceServiceRequest`` bytes. The native core's equivalents are in
``native/include/otelprof/spans.hpp``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

AttrValue = str | int | float | bool
Attrs = list[tuple[str, AttrValue]]


@dataclass
class Span:
    order: int
    trace_id: bytes
    span_id: bytes
    parent_id: bytes
    name: str
    start: int
    end: int
    attrs: Attrs
    events: list[tuple[int, int, Attrs]] = field(default_factory=list)
    dropped_events: int = 0
    links: list[tuple[bytes, bytes, Attrs]] = field(default_factory=list)
    dropped_links: int = 0


def millis(ns: int) -> str:
    """Nanoseconds as milliseconds with three decimals by integer arithmetic, truncated, as the
    native core writes them (spans.hpp append_millis)."""
    ns = max(0, ns)
    return f"{ns // 1_000_000}.{ns % 1_000_000 // 1000:03d}"


__all__ = ["AttrValue", "Attrs", "Span", "millis"]
