"""One small span per step, with a child per phase interval, shipped in batches.

The step span's trace id is the converter's for ``ProfilerStep#N`` of this run (``step|run|N``),
so a profiled step's operator spans land in the same trace. When the application has a current
OpenTelemetry span (an inference request, say), the step nests under it instead.

Steps are queued on the training thread (a bounded deque append) and encoded and submitted by
a background thread once a second, or sooner when many are waiting. The native core encodes them
with the GIL released (a Python encoder holding the GIL for ~30 us per step stalled a small
model's training thread by as much); without the native core, the reference encoder (the
official opentelemetry-proto classes), which the native encoder's bytes are tested against, is
the fallback.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from ..._native_module import native as _native
from ..._version import __version__
from ...otlp import encoder as reference
from ...otlp import ids
from ...otlp.ids import TraceIds
from ...otlp.spans import Attrs, Span, millis
from ..distributed.identity import Identity
from ..steps.step import Step

_log = logging.getLogger(__name__)


MAX_PENDING = 10_000  # steps waiting for the encoder; beyond that they are dropped (counted)
BATCH_STEPS = 512
FLUSH_INTERVAL_S = 1.0


class StepPhaseRecord(NamedTuple):
    """A phase span of a step record."""

    phase: str  # data, forward, backward, optimizer
    start_ns: int
    end_ns: int
    module: str | None  # a forward's root module class (None: unknown)


class StepRecord(NamedTuple):
    """What the step-span encoders get per step (the native encoder reads it as the tuple it is)."""

    name: str
    number: int
    start_ns: int
    end_ns: int
    ordinal: int  # the step span's id ordinal; its phases take the ones that follow
    trace_id: bytes | None  # the application span's; None: the step's own, hashed by the encoder
    parent_id: bytes | None
    samples: int | None
    tokens: int | None
    dropped_phases: int
    phases: list[StepPhaseRecord]
    micro_batches: int
    window: str | None  # Windows.mark(): "recorded:early" ...
    skipped: bool = False  # its optimizer update was skipped (a gradient scaler found inf/NaN)
    #: (allocated, reserved, resident peak bytes or None, out-of-memory errors caught):
    #: memory/peaks.py MemoryPeaks' reading at its end; None: not read
    memory: tuple[int | None, int | None, int | None, int] | None = None


class StepContext:
    """A step span's ids. Nested under an application span, the step takes that span's trace
    id; otherwise its own (the converter's ``step|run|N``), hashed only when first asked for
    (an exemplar at scrape time; the native encoder hashes it itself), not on the training thread."""

    __slots__ = ("_ids", "_trace_id", "number", "ordinal", "parent_id", "parent_trace_id")

    def __init__(self, ordinal: int, number: int, ids: TraceIds, parent: tuple[bytes, bytes] | None = None) -> None:
        self.ordinal = ordinal  # the step span's; its phases take the ones that follow
        self.number = number
        self._ids = ids
        self.parent_trace_id: bytes | None = None
        self.parent_id = b""
        if parent is not None:
            self.parent_trace_id, self.parent_id = parent
        self._trace_id = self.parent_trace_id

    @property
    def trace_id(self) -> bytes:
        trace_id = self._trace_id
        if trace_id is None:
            trace_id = self._trace_id = self._ids(str(self.number))
        return trace_id


#: (get_current, get_current_span); False once the import failed: decided once, never retried
#: per step (a failing import at every step costs the loop and disturbs the user's own profiler)
_otel: tuple[Callable[[], Any], Callable[[], Any]] | bool | None = None


def current_parent() -> tuple[bytes, bytes] | None:
    """(trace id, span id) of the application's current OpenTelemetry span, if any. A training
    loop's context is usually empty: that case costs one call."""
    global _otel
    if _otel is None:
        try:
            from opentelemetry import context, trace
        except ImportError:
            _otel = False
            return None
        _otel = (context.get_current, trace.get_current_span)
    if not isinstance(_otel, tuple):
        return None
    get_context, get_span = _otel
    if not get_context():  # no span, no baggage: nothing to nest under
        return None
    ctx = get_span().get_span_context()
    if not ctx.is_valid:
        return None
    return ctx.trace_id.to_bytes(16, "big"), ctx.span_id.to_bytes(8, "big")


def otel_context_var() -> Any:
    """OpenTelemetry's context variable, which the native tracker reads to skip ``current_parent``
    when the context is empty; None when the runtime context is another (then it is called)."""
    import contextvars

    try:
        from opentelemetry import context
    except ImportError:
        return None
    var = getattr(getattr(context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    return var if isinstance(var, contextvars.ContextVar) else None


def native_sink() -> Any:
    """A ``_native.StepSink`` bounded like the Python queue (None without the native core)."""
    return None if _native is None else _native.StepSink(MAX_PENDING, BATCH_STEPS)


class Submits(Protocol):
    """Where requests go: the exporter, or the session's trace route (export/sdk_route.py)."""

    def submit(self, request: bytes) -> None: ...


class StepSpans:
    max_request_bytes = 3 * 1024 * 1024  # the session sets OTELPROF_MAX_REQUEST_BYTES's value
    _thread: threading.Thread

    def __init__(
        self, exporter: Submits, identity: Identity, resource: Attrs, on_drop: Callable[[], None] | None = None
    ) -> None:
        self._exporter = exporter
        self.encoder = StepRecordEncoder(identity, resource)
        self._base = self.encoder.span_base
        self._trace_ids = self.encoder.trace_ids
        self._ordinal = 0
        self.dropped = 0
        self._on_drop = on_drop
        self._sink: Any = None
        self._start()
        os.register_at_fork(after_in_child=self._start)

    @property
    def native_queue(self) -> bool:
        """Whether the native core can queue steps for this encoder (see ``use_sink``)."""
        return self.encoder.native is not None

    def use_sink(self, sink: Any) -> None:
        """From now on steps are queued by the native core (``_native.StepSink``, fed by the
        step tracker) instead of ``add()``; this thread encodes them from there."""
        self._sink = sink

    def wake(self) -> None:
        """A batch is waiting (the native tracker calls this)."""
        with self._cond:
            self._cond.notify()

    def context(self, step: Step) -> StepContext:
        """Ids of ``step``'s span (called on the training thread, where the current span is)."""
        ordinal = self._ordinal
        self._ordinal += 1 + len(step.phases)
        return StepContext(ordinal, step.number, self._trace_ids, current_parent())

    def reserve(self, count: int) -> int:
        """Span id ordinals for spans made outside the queue (a failed step's): the first."""
        if self._sink is not None:
            return int(self._sink.reserve(count))
        first = self._ordinal
        self._ordinal += count
        return first

    def span_id(self, ctx: StepContext) -> bytes:
        """The step span's id (for the OTLP metrics' exemplars)."""
        return ids.span_id(self._base, ctx.ordinal)

    def add(self, step: Step, ctx: StepContext) -> None:
        """No lock: deque appends and pops are atomic, and the encoder pops what it takes."""
        pending = self._pending
        if len(pending) >= MAX_PENDING:
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
            if self.dropped == 1:
                _log.warning("step spans are produced faster than they can be encoded: dropping (counted)")
            return
        pending.append((step, ctx))
        if len(pending) == BATCH_STEPS:
            with self._cond:
                self._cond.notify()

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=timeout_s)
        self._flush()

    def pause(self, wait_s: float) -> None:
        """Stops the encoding thread; steps wait in the bounded queue (see ``coexist.quiet``)."""
        with self._cond:
            self._paused = True
            self._cond.notify()
        self._thread.join(wait_s)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            if self._closed or self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="otelprof-step-spans", daemon=True)
            self._thread.start()

    def _start(self) -> None:
        if self._sink is not None:  # a forked child: the parent ships what was queued
            self._sink.clear_queue()
        self._cond = threading.Condition()
        self._pending: deque[tuple[Step, StepContext]] = deque()
        self._closed = False
        self._paused = False
        self._thread = threading.Thread(target=self._run, name="otelprof-step-spans", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._closed and not self._paused:
                    self._cond.wait(FLUSH_INTERVAL_S)
                closed = self._closed
                if self._paused and not closed:
                    return  # no Python work while another profiler traces every thread
            try:
                self._flush()
            except Exception:
                _log.warning("encoding step spans failed", exc_info=True)
            if closed:
                return

    def _flush(self) -> None:
        sink = self._sink
        if sink is not None:
            for request in sink.encode(self.encoder.native, self.max_request_bytes):
                self._exporter.submit(request)
            if sink.spans_dropped and not self.dropped:
                _log.warning("step spans are produced faster than they can be encoded: dropping (counted)")
            self.dropped = max(self.dropped, sink.spans_dropped)
        pending = self._pending
        batch = [pending.popleft() for _ in range(len(pending))]  # steps added meanwhile stay
        if not batch:
            return
        for request in self.encoder.encode([record(step, ctx) for step, ctx in batch], self.max_request_bytes):
            self._exporter.submit(request)


class StepRecordEncoder:
    """Step records -> requests: the native core's encoder, or (``native=False``, or no native
    core) span-model Spans through the reference encoder; the two write the same bytes."""

    def __init__(self, identity: Identity, resource: Attrs, native: bool = True, version: str = __version__) -> None:
        self.span_base = ids.span_base(identity.run_id, f"live|{identity.rank}")
        prefix = f"step|{identity.run_id}|"  # the converter's step trace ids
        self.trace_ids = ids.TraceIds(prefix)
        self.native = (
            _native.StepSpanEncoder(list(resource), version, prefix, self.span_base)
            if native and _native is not None
            else None
        )
        self._resource = list(resource)
        self._version = version

    @property
    def resource(self) -> Attrs:
        """The resource every request carries (an out-of-memory step's requests too, memory/oom.py)."""
        return self._resource

    @property
    def version(self) -> str:
        """The instrumentation scope's version."""
        return self._version

    def encode(self, records: list[StepRecord], max_bytes: int) -> list[bytes]:
        """ExportTraceServiceRequest bytes of ``records`` (native, or the Python fallback)."""
        if self.native is not None:
            encoded: list[bytes] = self.native.encode(records, max_bytes)
            return encoded
        spans: list[Span] = []
        for rec in records:
            spans.extend(self.spans(rec, len(spans)))
        return reference.encode(spans, self._resource, self._version, max_bytes)

    def spans(self, rec: StepRecord, order: int) -> list[Span]:
        """A step's span and its phase spans, as the span model has them."""
        name, number, start_ns, end_ns, ordinal, trace_id, parent_id = rec[:7]
        samples, tokens, dropped, phases, batches, window = rec[7:13]
        skipped = len(rec) > 13 and bool(rec[13])
        memory = rec[14] if len(rec) > 14 else None
        attrs: Attrs = [("otelprof.step.number", number), ("otelprof.step.source", "live")]
        if samples is not None:
            attrs.append(("otelprof.step.samples", samples))
        if tokens is not None:
            attrs.append(("otelprof.step.tokens", tokens))
        if dropped:
            attrs.append(("otelprof.step.dropped_phases", dropped))
        if batches > 0:
            attrs.append(("otelprof.step.micro_batches", batches))
        if skipped:
            attrs.append(("otelprof.step.skipped", True))
        if window:
            mark, _, trigger = window.partition(":")  # Windows.mark(): "recorded:early"
            attrs.append(("otelprof.step.window", mark))
            if trigger:
                attrs.append(("otelprof.window.trigger", trigger))
        if memory is not None:
            attrs.extend(memory_attrs(*memory))
        attrs.extend(trace_list_attrs(number, samples, tokens, start_ns, end_ns, phases))
        if trace_id is None:
            trace_id = self.trace_ids(str(number))
        step_id = ids.span_id(self.span_base, ordinal)
        out = [Span(order, trace_id, step_id, parent_id or b"", name, start_ns, end_ns, attrs)]
        for i, (phase, start, end, module) in enumerate(phases, 1):
            phase_id = ids.span_id(self.span_base, ordinal + i)
            phase_attrs: Attrs = [("otelprof.phase.name", phase)]
            if module:
                phase_attrs.append(("otelprof.phase.module", module))
            span_name = f"{phase} {module}" if module else phase  # "forward GPT2LMHeadModel"
            out.append(Span(order + i, trace_id, phase_id, step_id, span_name, start, end, phase_attrs))
        return out


_INT64_MAX = 2**63 - 1
_PEAK_KEYS = (
    "otelprof.memory.peak.allocated_bytes",
    "otelprof.memory.peak.reserved_bytes",
    "otelprof.memory.peak.resident_bytes",
)


def memory_attrs(allocated: int | None, reserved: int | None, resident: int | None, ooms: int) -> Attrs:
    """A step's memory peaks (those read) and the out-of-memory errors it caught (if any)."""
    attrs: Attrs = [
        (key, v) for key, v in zip(_PEAK_KEYS, (allocated, reserved, resident), strict=True) if v is not None
    ]
    if ooms:
        attrs.append(("otelprof.memory.oom_count", ooms))
    return attrs


def trace_list_attrs(
    number: int,
    samples: int | None,
    tokens: int | None,
    start_ns: int,
    end_ns: int,
    phases: Sequence[tuple[str, int, int, str | None]],
) -> Attrs:
    """What a trace list shows of a step (OpenInference's ``input.value`` / ``output.value``,
    which Phoenix lists and MLflow turns into a trace's request and response previews):
    ``{"step": 12, "samples": 32}`` and the phases' total milliseconds in first-seen order,
    then the step's: ``{"data_ms": 1.204, "forward_ms": 40.118, ..., "step_ms": 97.310}``."""
    inputs = f'{{"step": {number}'
    if samples is not None:
        inputs += f', "samples": {samples}'
    if tokens is not None:
        inputs += f', "tokens": {tokens}'
    totals: dict[str, int] = {}
    for phase, start, end, _module in phases:
        totals[phase] = min(_INT64_MAX, totals.get(phase, 0) + max(0, end - start))  # the native sum saturates
    outputs = "".join(f'"{phase}_ms": {millis(ns)}, ' for phase, ns in totals.items())
    return [
        ("input.value", inputs + "}"),
        ("input.mime_type", "application/json"),
        ("output.value", f'{{{outputs}"step_ms": {millis(end_ns - start_ns)}}}'),
        ("output.mime_type", "application/json"),
    ]


def record(step: Step, ctx: StepContext) -> StepRecord:
    return StepRecord(
        step.name,
        step.number,
        step.start_ns,
        step.end_ns,
        ctx.ordinal,
        ctx.parent_trace_id,  # None: the step's own, hashed by the encoder
        ctx.parent_id or None,
        step.samples,
        step.tokens,
        step.dropped_phases,
        [StepPhaseRecord(*p, step.phase_module(i)) for i, p in enumerate(step.phases)],
        step.micro_batches,
        step.window,
        step.skipped,
        step.memory,
    )
