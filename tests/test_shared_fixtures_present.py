"""In CI the real traces must be there: without them most converter tests would skip, not fail."""

from __future__ import annotations

import prereqs
import pytest
from conftest import KINETO_DIR

# 15 Kineto traces in ../shared/traces/kineto (see its README); fewer means a broken checkout.
EXPECTED_AT_LEAST = 15


@pytest.mark.skipif(not prereqs.in_ci(), reason="only enforced in CI (CI=true)")
def test_shared_kineto_traces_are_present_in_ci() -> None:
    traces = sorted(KINETO_DIR.glob("*.json.gz")) if KINETO_DIR.is_dir() else []
    assert len(traces) >= EXPECTED_AT_LEAST, f"expected the shared Kineto traces in {KINETO_DIR}, found {len(traces)}"
