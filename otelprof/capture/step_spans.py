"""One small span per step, with a child per phase interval, shipped in batches.

The step span's trace id is the converter's for ``ProfilerStep#N`` of this run (``step|run|N``),
so a profiled step's operator spans land in the same trace. When the application has a current
OpenTelemetry span (an inference request, say), the step nests under it instead.

Steps are queued on the training thread (a bounded deque append) and encoded and submitted by
a background thread once a second, or sooner when many are waiting.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .._version import __version__
from ..converter.reference import ids
from ..converter.reference.builder import Attrs, Span
from ..export.exporter import Exporter
from .identity import Identity
from .step_encoder import StepEncoder
from .steps import Step

_log = logging.getLogger(__name__)

MAX_PENDING = 10_000  # steps waiting for the encoder; beyond that they are dropped (counted)
BATCH_STEPS = 512
FLUSH_INTERVAL_S = 1.0


@dataclass(frozen=True)
class StepContext:
    trace_id: bytes
    ordinal: int  # the step span's; its phases take the ones that follow
    parent_id: bytes = b""


def current_parent() -> tuple[bytes, bytes] | None:
    """(trace id, span id) of the application's current OpenTelemetry span, if any."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return ctx.trace_id.to_bytes(16, "big"), ctx.span_id.to_bytes(8, "big")


class StepSpans:
    def __init__(
        self, exporter: Exporter, identity: Identity, resource: Attrs, on_drop: Callable[[], None] | None = None
    ) -> None:
        self._exporter = exporter
        self._encoder = StepEncoder(list(resource), __version__)
        self._base = ids.span_base(identity.run_id, f"live|{identity.rank}")
        self._trace_ids = ids.TraceIds(f"step|{identity.run_id}|")  # the converter's step trace ids
        self._ordinal = 0
        self.dropped = 0
        self._on_drop = on_drop
        self._start()
        os.register_at_fork(after_in_child=self._start)

    def context(self, step: Step) -> StepContext:
        """Ids of ``step``'s span (called on the training thread, where the current span is)."""
        ordinal = self._ordinal
        self._ordinal += 1 + len(step.phases)
        parent = current_parent()
        if parent is not None:
            return StepContext(parent[0], ordinal, parent[1])
        return StepContext(self._trace_ids(str(step.number)), ordinal)

    def span_id(self, ctx: StepContext) -> bytes:
        """The step span's id (for the OTLP metrics' exemplars)."""
        return ids.span_id(self._base, ctx.ordinal)

    def add(self, step: Step, ctx: StepContext) -> None:
        with self._cond:
            if len(self._pending) >= MAX_PENDING:
                self.dropped += 1
                if self._on_drop is not None:
                    self._on_drop()
                if self.dropped == 1:
                    _log.warning("step spans are produced faster than they can be encoded: dropping (counted)")
                return
            self._pending.append((step, ctx))
            if len(self._pending) >= BATCH_STEPS:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self._flush()

    def _start(self) -> None:
        self._cond = threading.Condition()
        self._pending: deque[tuple[Step, StepContext]] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="otelprof-step-spans", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._closed:
                    self._cond.wait(FLUSH_INTERVAL_S)
                closed = self._closed
            try:
                self._flush()
            except Exception:
                _log.warning("encoding step spans failed", exc_info=True)
            if closed:
                return

    def _flush(self) -> None:
        with self._cond:
            batch = list(self._pending)
            self._pending.clear()
        if not batch:
            return
        spans: list[Span] = []
        for step, ctx in batch:
            spans.extend(self._spans(step, ctx, len(spans)))
        for request in self._encoder.encode(spans, 3 * 1024 * 1024):
            self._exporter.submit(request)

    def _spans(self, step: Step, ctx: StepContext, order: int) -> list[Span]:
        attrs: Attrs = [("pytorch.step", step.number), ("otelprof.step.source", "live")]
        if step.samples is not None:
            attrs.append(("otelprof.step.samples", step.samples))
        if step.tokens is not None:
            attrs.append(("otelprof.step.tokens", step.tokens))
        if step.dropped_phases:
            attrs.append(("otelprof.step.dropped_phases", step.dropped_phases))
        step_id = ids.span_id(self._base, ctx.ordinal)
        out = [Span(order, ctx.trace_id, step_id, ctx.parent_id, step.name, step.start_ns, step.end_ns, attrs)]
        for i, (phase, start, end) in enumerate(step.phases, 1):
            phase_id = ids.span_id(self._base, ctx.ordinal + i)
            out.append(Span(order + i, ctx.trace_id, phase_id, step_id, phase, start, end, [("otelprof.phase", phase)]))
        return out
