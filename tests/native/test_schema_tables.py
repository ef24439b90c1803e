"""The native tables (native/src/schema.cpp) and the reference's (reference/schema.py) are one spec."""

from __future__ import annotations

import pytest

from otelprof.converter import native_available
from otelprof.otlp import schema

pytestmark = pytest.mark.skipif(not native_available(), reason="otelprof._native is not built")


def test_argument_table_matches_reference() -> None:
    from otelprof import _native

    assert [tuple(row) for row in _native.schema()["arg_attributes"]] == list(schema.ARG_ATTRIBUTES)


def test_memory_table_matches_reference() -> None:
    from otelprof import _native

    assert [tuple(row) for row in _native.schema()["memory_attributes"]] == list(schema.MEMORY_ATTRIBUTES)


@pytest.mark.parametrize("category", [*schema.CATEGORY_KIND, "", "some_future_category", "CPU_OP"])
def test_category_kinds_match_reference(category: str) -> None:
    from otelprof import _native

    assert _native.category_kind(category) == schema.CATEGORY_KIND.get(category, schema.Kind.OTHER)


def test_native_errors_are_value_errors() -> None:
    from otelprof import _native

    with pytest.raises(ValueError, match="traceEvents"):
        _native.convert(b'{"traceEvents": 3}', {})
