"""The native core's step-span encoder against the reference encoder (official
opentelemetry-proto classes): identical bytes, request splitting included.

Live sessions use the native encoder; the reference encoder is its fallback (the hand-written
Python StepEncoder that sat between them went in issue 17). Speed, for the record (not
asserted): on the 2-core dev machine, 1,000 steps of 5 spans took ~70 us/step through the
official classes (plus ~16 us/step building span-model Spans), and ~1 us/step natively (GIL
released)."""

from __future__ import annotations

from typing import Any

import pytest
from converter_helpers import native_module
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.otlp.encoder import encode
from otelprof.otlp.spans import Attrs, Span

RESOURCE: Attrs = [("service.name", "trainer"), ("otelprof.distributed.rank", 3), ("host.name", "h\udcff")]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.text(max_size=12))
def test_prefixed_trace_ids_equal_the_converters(prefix: str, suffix: str) -> None:
    from otelprof.otlp import ids

    assert ids.TraceIds(prefix)(suffix) == ids.trace_id(prefix + suffix)


# --- the native core's step-span encoder (what live sessions use) --------------------------

step_record = st.tuples(
    st.text(max_size=20),  # name (lone surrogates included)
    st.integers(min_value=-5, max_value=2**40),  # number
    st.integers(min_value=0, max_value=2**63 - 1),  # start
    st.integers(min_value=0, max_value=2**63 - 1),  # end
    st.integers(min_value=0, max_value=2**40),  # ordinal
    st.one_of(st.none(), st.binary(min_size=16, max_size=16)),  # trace id (an application span's)
    st.one_of(st.none(), st.binary(min_size=8, max_size=8)),  # parent id
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),  # samples
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),  # tokens
    st.integers(min_value=0, max_value=100),  # dropped phases
    st.lists(
        st.tuples(
            st.sampled_from(["data", "forward", "backward", "optimizer"]),
            st.integers(min_value=0, max_value=2**63 - 1),
            st.integers(min_value=0, max_value=2**63 - 1),
            st.one_of(st.none(), st.text(max_size=12)),  # a forward's module (lone surrogates included)
        ),
        max_size=6,
    ),
    st.integers(min_value=0, max_value=100),  # micro-batches (0: no attribute)
    st.one_of(  # profiling-window mark, a window's steps with its trigger (Windows.mark)
        st.none(),
        st.sampled_from(["recorded", "warmup", "after", "recorded:early", "warmup:on_demand", "recorded:"]),
    ),
)
_peak = st.one_of(st.none(), st.integers(min_value=0, max_value=2**63 - 1))
#: with StepRecord's defaulted fields: skipped, then memory (peaks and OOMs caught, or None)
full_record = st.builds(
    lambda rec, skipped, memory: (*rec, skipped, memory),
    step_record,
    st.booleans(),
    st.one_of(st.none(), st.tuples(_peak, _peak, _peak, st.integers(min_value=0, max_value=5))),
)
step_records = st.lists(st.one_of(step_record, full_record), max_size=30)


def _encoder(native: bool) -> Any:
    from otelprof.capture.distributed.identity import Identity
    from otelprof.capture.spans.step_spans import StepRecordEncoder

    return StepRecordEncoder(Identity("run-\udcff", rank=3), RESOURCE, native=native, version="1.2.3")


@settings(max_examples=200, deadline=None)
@given(step_records, st.sampled_from([700, 3_000, 3 * 1024 * 1024]))
def test_native_step_records_equal_the_official_classes(records: list, max_bytes: int) -> None:
    """The native encoder's requests equal the official classes' encoding of the same spans
    (ids, parents, names, times, attributes, the split into requests)."""
    native_module()
    native, python = _encoder(native=True), _encoder(native=False)
    assert native.native is not None and python.native is None
    spans: list[Span] = []
    for rec in records:
        spans.extend(python.spans(rec, len(spans)))
    expected = encode(spans, RESOURCE, "1.2.3", max_bytes)
    assert native.encode(records, max_bytes) == expected
    assert python.encode(records, max_bytes) == expected


def test_native_step_records_are_checked() -> None:
    native = native_module()
    enc = native.StepSpanEncoder(RESOURCE, "v", "step|r|", 7)
    good = ("train.step", 1, 10, 20, 0, None, None, None, None, 0, [("forward", 10, 12, "GPT2LMHeadModel")], 4, "after")
    [request] = enc.encode([good], 1 << 20)
    assert b"otelprof.step.micro_batches" in request
    assert b"otelprof.step.window" in request and b"after" in request
    assert b"otelprof.phase.module" in request and b"GPT2LMHeadModel" in request
    [unmarked] = enc.encode([(*good[:12], None)], 1 << 20)
    assert b"otelprof.step.window" not in unmarked
    assert len(enc.encode([good], 1 << 20)) == 1
    with pytest.raises(TypeError):
        enc.encode([good[:5]], 1 << 20)
    with pytest.raises(ValueError):
        enc.encode([(*good[:5], b"short", *good[6:])], 1 << 20)
    with pytest.raises(TypeError):
        native.StepSpanEncoder([("k", [1, 2])], "v", "step|r|", 7)
