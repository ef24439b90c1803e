"""Full detail has no span budget in the core itself, whatever ``span_budget`` the caller passes.

``ConvertOptions.as_native()`` sends 0 at full detail, but the core's own default is 1000: a
trace over it at full detail once read the default-detail worth table, empty at full detail, out
of bounds (UBSan found it under .ci/sanitize; a Release build crashed).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

from converter_helpers import native_module

from otelprof.converter import ConvertOptions


def test_full_detail_ignores_the_span_budget(kineto_trace: Callable[[str], Path]) -> None:
    native = native_module()
    data = gzip.decompress(kineto_trace("trace_filter__sampled_rank-0").read_bytes())
    options = ConvertOptions(detail="full").as_native()
    assert options["span_budget"] == 0
    unlimited = native.convert(data, options)
    assert unlimited.stats["spans"] == 4813  # every complete event, well over the budget
    budgeted = native.convert(data, {**options, "span_budget": 1000})
    assert budgeted.stats == unlimited.stats
    assert budgeted.requests == unlimited.requests
