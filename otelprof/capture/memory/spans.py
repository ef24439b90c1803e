"""A window's memory as spans: one ``memory · <device>`` span per recorded step and device,
a child of the step's ``train.step`` span in its trace, over the step's interval. It carries
each category's peak within the step (``otelprof.memory.<category>.peak_bytes``) and an
``otelprof.memory`` event at each phase's start and end with the bytes each category held then
(``otelprof.memory.<category>.bytes``). Span ids are derived from the step's span id and the
device under a key of their own, so they are stable and meet neither the converter's nor the
step spans' ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...converter import ConvertOptions
from ...otlp import ids
from ...otlp.encoder import encode
from ...otlp.spans import Attrs, Span
from .timeline import CATEGORIES, DeviceMemory, Sizes

SPAN_NAME = "memory · {device}"


def _by_category(sizes: Sizes, suffix: str) -> Attrs:
    return [(f"otelprof.memory.{c}.{suffix}", int(v)) for c, v in zip(CATEGORIES, sizes, strict=True)]


def memory_spans(devices: Sequence[DeviceMemory], run_id: str, rank: int | None) -> list[Span]:
    spans: list[Span] = []
    for device in devices:
        for s in device.steps:
            key = f"memory|{s.step.span_id.hex()}|{device.device}"
            attrs: Attrs = [("otelprof.memory.device", device.device), ("otelprof.step.number", s.step.number)]
            attrs += _by_category(s.peaks, "peak_bytes")
            attrs.append(("otelprof.memory.total.peak_bytes", s.total_peak))
            events = [
                (
                    b.time_ns,
                    k,
                    [
                        ("otelprof.phase.name", b.phase),
                        ("otelprof.phase.boundary", b.edge),
                        *_by_category(b.sizes, "bytes"),
                    ],
                )
                for k, b in enumerate(s.boundaries)
            ]
            span_id = ids.span_id(ids.span_base(run_id, str(rank or 0), key), 0)
            name = SPAN_NAME.format(device=device.device)
            spans.append(
                Span(len(spans), s.step.trace_id, span_id, s.step.span_id, name, s.start_ns, s.end_ns, attrs, events)
            )
    return spans


def memory_requests(devices: Sequence[DeviceMemory], options: ConvertOptions) -> list[bytes]:
    """The spans of ``devices`` as requests under the window's resource (the session's)."""
    spans = memory_spans(devices, options.run_id or "", options.rank)
    if not spans:
        return []
    resource = list(options.resource_attributes)
    return encode(spans, resource, options.scope_version, options.max_request_bytes)
