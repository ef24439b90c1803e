"""Fixtures shared by the converter tests (tests/converter/)."""

from __future__ import annotations

import pytest
from converter_helpers import ENGINES, skip_unless_native  # tests/ is on pythonpath (pyproject.toml)


@pytest.fixture(scope="session", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Each converter engine. "native" is skipped only when ``otelprof._native`` is not built
    and ``OTELPROF_REQUIRE_NATIVE`` is unset (CI sets it, so a broken build fails instead)."""
    if request.param == "native":
        skip_unless_native()
    return str(request.param)
