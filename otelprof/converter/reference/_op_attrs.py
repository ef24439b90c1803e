"""``ConvertOptions.op_attributes`` on the op spans, and the device memory peaks' marks
(native: ``build_op_attrs.cpp``).

The attributes given for a ``Record function id`` (an execution trace's join) go on the span of
the event with that id; an event that is no span of its own (aggregated, or folded into the span
above it) is counted as unplaced, never moved onto another op (its aggregate or parent stands
for many ops); an id no event had is counted as unmatched; an event whose id has none (when any
are given) as missing.
"""

from __future__ import annotations

from ...otlp.spans import Attrs, AttrValue
from ._state import _BuildState
from .jsonload import as_int64

RECORD_FUNCTION_ID = "Record function id"


def op_attributes(st: _BuildState) -> None:
    given = st.opts.op_attributes
    st.op_attrs = {}
    if not given:
        return
    seen: set[int] = set()
    for i, e in enumerate(st.ev):
        rf_id = as_int64(e.args.get(RECORD_FUNCTION_ID))
        if rf_id is None:
            continue
        if rf_id not in given:
            st.stats["op_attributes_missing"] += 1
            continue
        seen.add(rf_id)
        if not st.keep[i]:
            st.stats["op_attributes_unplaced"] += 1
            continue
        st.stats["op_attributes_joined"] += 1
        st.op_attrs[i] = list(given[rf_id])
    st.stats["op_attributes_unmatched"] = len(given) - len(seen)


def added_attributes(st: _BuildState, i: int, span_id: bytes) -> Attrs:
    """Event ``i``'s op attributes, then the memory peak its span holds (the first device's)."""
    out: list[tuple[str, AttrValue]] = list(st.op_attrs.get(i, ()))
    for target, peak, device in st.memory_peaks.values():
        if target == span_id:
            out += [("otelprof.memory.peak_bytes", peak), ("otelprof.memory.peak_device", device)]
            break
    return out
