"""``instrument()`` / ``uninstrument()`` and the running session: the public face of the live
side, whose session lives in ``otelprof.capture.session``."""

from __future__ import annotations

from .capture.session import Session, instrument, session, set_batch_size, step, step_scope, uninstrument
from .capture.windows.handler import trace_handler

__all__ = ["Session", "instrument", "session", "set_batch_size", "step", "step_scope", "trace_handler", "uninstrument"]
