"""``otelprof._native``, imported once for every user (converter, gzip loader, live capture).

``native`` is the compiled module, typed by ``_native.pyi``, or ``None`` when it does not load;
``native_error`` says why. With ``OTELPROF_REQUIRE_NATIVE`` set (CI), a module that does not
load raises ``ImportError`` here instead of letting the Python fallbacks take over.
"""

from __future__ import annotations

import logging
import os

from .settings import value
from .settings.variables import OTELPROF_REQUIRE_NATIVE

native_error: str | None = None
try:
    from . import _native as native
except ImportError as exc:  # pragma: no cover - a broken build; the Python fallbacks take over
    if value(os.environ, OTELPROF_REQUIRE_NATIVE, logging.getLogger(__name__)):
        raise
    native = None  # type: ignore[assignment]
    native_error = str(exc)

__all__ = ["OTELPROF_REQUIRE_NATIVE", "native", "native_error"]
