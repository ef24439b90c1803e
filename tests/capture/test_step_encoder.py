"""The hand-written step-span encoder against the reference encoder (official
opentelemetry-proto classes): identical bytes, request splitting included.

Live sessions use the native core's encoder, which must write the same bytes; the Python one is
its fallback. Speed, for the record (not asserted): on the 2-core dev machine, 1,000 steps of 5
spans took ~70 us/step through the official classes, ~24 us/step with the Python encoder (plus
~16 us/step building span-model Spans), and ~1 us/step natively (GIL released)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.capture.step_encoder import StepEncoder
from otelprof.otlp.encoder import encode
from otelprof.otlp.spans import Attrs, Span

RESOURCE: Attrs = [("service.name", "trainer"), ("pytorch.distributed.rank", 3), ("host.name", "h\udcff")]

values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
spans = st.lists(
    st.builds(
        Span,
        order=st.just(0),
        trace_id=st.binary(min_size=16, max_size=16),
        span_id=st.binary(min_size=8, max_size=8),
        parent_id=st.one_of(st.just(b""), st.binary(min_size=8, max_size=8)),
        name=st.text(max_size=30),
        start=st.integers(min_value=0, max_value=2**64 - 1),
        end=st.integers(min_value=0, max_value=2**64 - 1),
        attrs=st.lists(st.tuples(st.sampled_from(["pytorch.step", "otelprof.phase", "k"]), values), max_size=5),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(spans, st.sampled_from([600, 2_000, 3 * 1024 * 1024]))
def test_same_bytes_as_the_official_classes(batch: list[Span], max_bytes: int) -> None:
    assert StepEncoder(RESOURCE, "1.2.3").encode(batch, max_bytes) == encode(batch, RESOURCE, "1.2.3", max_bytes)


def test_spans_with_events_or_links_take_the_reference_path() -> None:
    span = Span(
        0, b"t" * 16, b"s" * 8, b"", "op", 1, 2, [], events=[(1, 0, [("a", 1)])], links=[(b"x" * 16, b"y" * 8, [])]
    )
    assert StepEncoder(RESOURCE, "v").encode([span], 1 << 20) == encode([span], RESOURCE, "v", 1 << 20)


def test_live_step_spans_use_it() -> None:
    pytest.importorskip("torch")
    from otelprof.capture import step_spans

    assert step_spans.StepEncoder is StepEncoder


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.text(max_size=12))
def test_prefixed_trace_ids_equal_the_converters(prefix: str, suffix: str) -> None:
    from otelprof.otlp import ids

    assert ids.TraceIds(prefix)(suffix) == ids.trace_id(prefix + suffix)


# --- the native core's step-span encoder (what live sessions use) --------------------------

step_records = st.lists(
    st.tuples(
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
    ),
    max_size=30,
)


def _encoder(native: bool) -> Any:
    from otelprof.capture.identity import Identity
    from otelprof.capture.step_spans import StepRecordEncoder

    return StepRecordEncoder(Identity("run-\udcff", rank=3), RESOURCE, native=native, version="1.2.3")


@settings(max_examples=200, deadline=None)
@given(step_records, st.sampled_from([700, 3_000, 3 * 1024 * 1024]))
def test_native_step_records_equal_the_official_classes(records: list, max_bytes: int) -> None:
    """The native encoder's requests equal the official classes' encoding of the same spans
    (ids, parents, names, times, attributes, the split into requests)."""
    pytest.importorskip("otelprof._native")
    native, python = _encoder(native=True), _encoder(native=False)
    assert native.native is not None and python.native is None
    spans: list[Span] = []
    for rec in records:
        spans.extend(python.spans(rec, len(spans)))
    expected = encode(spans, RESOURCE, "1.2.3", max_bytes)
    assert native.encode(records, max_bytes) == expected
    assert python.encode(records, max_bytes) == expected


def test_native_step_records_are_checked() -> None:
    native = pytest.importorskip("otelprof._native")
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
