"""The import loop: convert each file, hand its requests to the exporter in bounded batches,
and record each batch in the ledger once the exporter has delivered it (sent, or written to
the spool that it replays later).

- A file is converted completely before any of its requests is submitted, so a bad file sends
  nothing. Its list of requests lets go of each batch once submitted (``ConvertResult.requests``
  is emptied as the import goes), so a big file and the next one's conversion are not both
  held whole.
- A batch is recorded only after ``Exporter.flush`` says the queue is empty and nothing is in
  flight, and only if the exporter lost none of it meanwhile (``losses()``: rejected by the
  backend, refused by an unwritable spool, ...); the ledger therefore never claims a request
  that was or could still be lost, and a resumed import sends what was not confirmed. A file
  with a lost batch stops there (its later batches could not be recorded either): it is a
  failed file, and ``--resume`` sends it from its last recorded batch.
- One batch is in flight at a time, and the work around it overlaps it: the next files are
  read and converted on a thread of their own (``_Ahead``: the next file always, more while
  their requests stay under ``AHEAD_BATCHES`` batches; the converter and the inflater release
  the GIL) while the exporter sends this one's batches; a file's digest is taken while its
  first batch is sent, and a delivered batch is written to the ledger (an fsync) once the next
  batch is on its way.
- ``stop`` (set by the CLI on SIGINT/SIGTERM) is honoured between batches: the batch in flight
  is finished and recorded, nothing new is submitted.
- What was delivered is also dated (``Report.first_start_ns``, ``last_end_ns``, the first trace
  ids): imported traces keep their recording time, so a UI opened on its last hours shows none
  of them until its time range covers that. Each request's spans are read for it on the
  conversion thread (``span_times``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Protocol

from ..converter import ConvertOptions, ConvertResult, TraceFormatError, convert
from ..converter.execution_trace import op_attributes, read_execution_trace
from ..otlp.resource import ResourceFacts
from ._kineto import ProcessOptions
from .discover import EXECUTION_TRACE, NSYS, Source
from .ledger import Entry, Ledger, digest, fingerprint
from .nsys import convert_nsys
from .progress import Progress

_log = logging.getLogger(__name__)

#: Bytes submitted per batch before waiting for delivery: far below the exporter's 64 MiB
#: queue, so nothing ever takes the overflow path, and a Ctrl-C waits for little.
DEFAULT_BATCH_BYTES = 8 * 1024 * 1024
#: Converted requests held ahead of the file being sent, in batches (see _Ahead).
AHEAD_BATCHES = 4


#: Trace ids the report keeps, in the order their first span was delivered.
FIRST_TRACES = 3


class Sink(Protocol):
    def submit(self, request: bytes) -> None: ...
    def flush(self, timeout_s: float = 10.0) -> bool: ...
    def losses(self) -> int: ...


def convert_source(source: Source, options: ConvertOptions, engine: str = "auto") -> ConvertResult:
    """One file's requests; raises TraceFormatError (one line, naming the file) for bad input."""
    if source.kind == NSYS:
        return convert_nsys(source.path, options, engine)
    if source.kind == EXECUTION_TRACE:
        raise TraceFormatError(f"{source.path}: an execution trace with no Kineto trace to pair with")
    try:  # an import says so on its resource (otelprof.source.format): a Collector routes it whole
        if source.execution_trace is not None:  # joined into the op spans, named on the roots
            et = read_execution_trace(source.execution_trace)
            options = dataclasses.replace(
                options, op_attributes=op_attributes(et), execution_trace_file=str(source.execution_trace)
            )
        imported = ProcessOptions(**_fields(options), process=ResourceFacts(source_format=KINETO_FORMAT))
        return convert(source.path, options=imported, engine=engine)
    except TraceFormatError as exc:
        message = str(exc)
        raise TraceFormatError(
            message if message.startswith(str(source.path)) else f"{source.path}: {message}"
        ) from None


#: ``otelprof.source.format`` of an imported Kineto trace (nsys and nvprof name their own).
KINETO_FORMAT = "kineto-json"


def _fields(options: ConvertOptions) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(ConvertOptions)}


@dataclass(frozen=True)
class SpanTimes:
    """A request's earliest span start, latest span end (Unix ns) and first trace ids."""

    start_ns: int
    end_ns: int
    trace_ids: tuple[bytes, ...]


def span_times(request: bytes, traces: int = 0) -> SpanTimes | None:
    """A request's times and its first ``traces`` trace ids; None for a request without spans.
    Read through messages holding only those fields (``_lite_request``): the rest, attributes
    above all, is skipped unparsed: the parse costs about a fifth of a whole decode, the
    reading with it about two fifths (some 450 MB/s of requests)."""
    start, end = -1, -1
    ids: dict[bytes, None] = {}
    for rs in _lite_request().FromString(request).resource_spans:
        for ss in rs.scope_spans:
            spans = ss.spans
            if not spans:
                continue
            a, b = min(map(_START, spans)), max(map(_END, spans))
            start = a if start < 0 else min(start, a)
            end = max(end, b)
            if len(ids) < traces:
                ids.update(dict.fromkeys(map(_TRACE_ID, spans)))
    return SpanTimes(start, end, tuple(ids)[:traces]) if start >= 0 else None


_START, _END, _TRACE_ID = attrgetter("start"), attrgetter("end"), attrgetter("trace_id")


@functools.cache
def _lite_request() -> Any:
    """``ExportTraceServiceRequest`` down to each span's trace id (field 1), start (7) and end
    (8), in a pool of its own: the same bytes parse into it, every other field left unread."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="otelprof_span_times.proto", package="otelprof_lite")
    for name, fields in (
        ("Span", [("trace_id", 1, field.TYPE_BYTES, ""), ("start", 7, field.TYPE_FIXED64, ""),
                  ("end", 8, field.TYPE_FIXED64, "")]),
        ("ScopeSpans", [("spans", 2, field.TYPE_MESSAGE, "Span")]),
        ("ResourceSpans", [("scope_spans", 2, field.TYPE_MESSAGE, "ScopeSpans")]),
        ("Request", [("resource_spans", 1, field.TYPE_MESSAGE, "ResourceSpans")]),
    ):  # fmt: skip
        message = proto.message_type.add(name=name)
        for fname, number, kind, of in fields:
            label = field.LABEL_REPEATED if of else field.LABEL_OPTIONAL
            entry = message.field.add(name=fname, number=number, type=kind, label=label)
            if of:
                entry.type_name = f".otelprof_lite.{of}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("otelprof_lite.Request"))


@dataclass
class Report:
    files_sent: int = 0
    files_skipped: int = 0  # complete in the ledger (--resume)
    files_failed: int = 0
    requests: int = 0  # delivered this run
    requests_lost: int = 0  # submitted this run and not delivered (not in the ledger)
    spans: int = 0
    events: int = 0
    stopped: bool = False
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    first_start_ns: int | None = None  # of the spans delivered this run
    last_end_ns: int | None = None
    trace_ids: list[bytes] = field(default_factory=list)  # the first FIRST_TRACES delivered
    # execution traces (pairing.py): unpaired ones (not imported), Kineto traces beside execution
    # traces with none of their own, and the joins: op spans given a node's attributes, nodes no
    # op had, ops with a record function id but no node
    execution_traces_unpaired: int = 0
    kineto_without_execution_trace: int = 0
    et_ops_joined: int = 0
    et_nodes_unmatched: int = 0
    et_ops_missing: int = 0

    def dated(self, times: SpanTimes | None) -> None:
        """Widens the delivered range by a delivered request's spans."""
        if times is None:
            return
        if self.first_start_ns is None or times.start_ns < self.first_start_ns:
            self.first_start_ns = times.start_ns
        if self.last_end_ns is None or times.end_ns > self.last_end_ns:
            self.last_end_ns = times.end_ns
        for trace in times.trace_ids:
            if len(self.trace_ids) < FIRST_TRACES and trace not in self.trace_ids:
                self.trace_ids.append(trace)


@dataclass
class _Batch:
    source: Source
    entry: Entry
    count: int  # requests in the batch
    events: int
    spans: int
    nbytes: float
    last: bool
    losses_before: int  # the sink's losses() when the batch was submitted
    times: list[SpanTimes | None]  # of each request


@dataclass
class _Prepared:
    """A file made ready to send, off the import loop's thread: its ledger entry (on resume),
    and its conversion unless the ledger says it is complete or it cannot be read."""

    source: Source
    size: int = 0
    mtime_ns: int = 0
    options: str = ""  # fingerprint
    entry: Entry | None = None
    result: ConvertResult | None = None
    error: str | None = None
    times: list[SpanTimes | None] = field(default_factory=list)  # of each request

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.result.requests)) if self.result is not None else 0


class _Ahead:
    """Files prepared (converted) in order on a thread of their own, ahead of the import loop
    that takes them: the next file always, more while the requests converted and not yet taken
    stay under ``budget`` bytes (so small files do not wait for a big one's batches to be sent,
    and memory stays bounded). Nothing new starts once ``stop`` is set."""

    def __init__(
        self, prepare: Callable[[Source], _Prepared], sources: Sequence[Source], budget: int, stop: threading.Event
    ) -> None:
        self._prepare = prepare
        self._sources = sources
        self._budget = budget
        self._stop = stop
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otelprof-import-convert")
        self._lock = threading.Lock()
        self._futures: deque[Future[_Prepared]] = deque()
        self._held = 0  # request bytes of prepared files not taken yet
        self._next = 0  # index of the next source to prepare
        self._closed = False
        self._top_up()

    def take(self) -> _Prepared | None:
        """The next file, once prepared (its errors raised here); None when all were taken or
        ``stop`` was set before it started."""
        with self._lock:
            future = self._futures.popleft() if self._futures else None
        if future is None:
            return None
        prepared = future.result()
        with self._lock:
            self._held -= prepared.nbytes
        self._top_up()
        return prepared

    def close(self, wait: bool = True) -> None:
        """Starts nothing more; waits for the file being prepared (if any) when ``wait``."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def _top_up(self) -> None:
        with self._lock:
            busy = any(not f.done() for f in self._futures)
            full = bool(self._futures) and self._held >= self._budget
            if busy or full or self._next >= len(self._sources) or self._stop.is_set() or self._closed:
                return
            future = self._pool.submit(self._prepare, self._sources[self._next])
            self._next += 1
            self._futures.append(future)
        future.add_done_callback(self._prepared)

    def _prepared(self, future: Future[_Prepared]) -> None:
        if not future.cancelled() and future.exception() is None:
            with self._lock:
                self._held += future.result().nbytes
            self._top_up()


class Importer:
    """Imports ``sources`` in order (``run``). ``options_for`` is called, and each file read and
    converted, on the conversion thread (``_Ahead``); everything else happens on the caller's."""

    def __init__(
        self,
        sink: Sink,
        ledger: Ledger,
        options_for: Callable[[Source], ConvertOptions],
        *,
        engine: str = "auto",
        resume: bool = False,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
        on_error: Callable[[str], None] = lambda message: None,
        on_file: Callable[[Source, ConvertResult, int], None] = lambda source, result, skipped: None,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        self.sink = sink
        self.ledger = ledger
        self.options_for = options_for
        self.engine = engine
        self.resume = resume
        self.progress = progress
        self.stop = stop or threading.Event()
        self.on_error = on_error
        self.on_file = on_file
        self.batch_bytes = batch_bytes
        self.report = Report()
        self._pending: _Batch | None = None
        self._lost: set[str] = set()  # keys of files with a lost batch

    def run(self, sources: Sequence[Source]) -> Report:
        started = time.perf_counter()
        ahead = _Ahead(self._prepare, sources, AHEAD_BATCHES * self.batch_bytes, self.stop)
        finished = False
        try:
            while not self.stop.is_set() and (prepared := ahead.take()) is not None:
                self._import(prepared)
            self._confirm()
            finished = True
        finally:
            ahead.close(wait=finished)  # a second Ctrl-C does not wait for a conversion
            self.report.stopped = self.stop.is_set()
            self.report.seconds = time.perf_counter() - started
        return self.report

    def _prepare(self, source: Source) -> _Prepared:
        """Runs on the conversion thread: reads nothing the import loop writes but the ledger's
        entry for this file, which only this file's own import (later, on the loop) changes."""
        if source.kind == EXECUTION_TRACE:
            return _Prepared(source)
        options = self.options_for(source)
        try:
            st = source.path.stat()
        except OSError as exc:
            return _Prepared(source, error=f"{source.path}: cannot read ({exc.strerror or exc})")
        et = f"|{source.execution_trace}" if source.execution_trace is not None else ""
        fp = fingerprint(f"{source.kind}|{options!r}{et}")
        entry = self.ledger.get(source.key, st.st_size, st.st_mtime_ns, fp) if self.resume else None
        prepared = _Prepared(source, st.st_size, st.st_mtime_ns, fp, entry)
        if entry is not None and entry.complete:
            return prepared
        try:
            prepared.result = convert_source(source, options, self.engine)
        except (TraceFormatError, RuntimeError) as exc:  # RuntimeError: engine="native" without the module
            prepared.error = " ".join(str(exc).splitlines())
            return prepared
        seen: set[bytes] = set()  # trace ids are read until the file has given FIRST_TRACES
        for request in prepared.result.requests:
            times = span_times(request, FIRST_TRACES if len(seen) < FIRST_TRACES else 0)
            seen.update(times.trace_ids if times is not None else ())
            prepared.times.append(times)
        return prepared

    def _import(self, prepared: _Prepared) -> None:
        source, entry, result = prepared.source, prepared.entry, prepared.result
        if source.kind == EXECUTION_TRACE:  # unpaired (pairing.py logged it): counted, not imported
            self.report.execution_traces_unpaired += 1
            self._advance(nbytes=source.size, files=1)
            return
        self.report.kineto_without_execution_trace += source.execution_trace_missing
        if result is not None and source.execution_trace is not None:
            self.report.et_ops_joined += result.stats.get("op_attributes_joined", 0)
            self.report.et_nodes_unmatched += result.stats.get("op_attributes_unmatched", 0)
            self.report.et_ops_missing += result.stats.get("op_attributes_missing", 0)
        if result is None and prepared.error is None:  # complete in the ledger
            self.report.files_skipped += 1
            self._advance(nbytes=source.size, files=1)
            return
        done = self._settle()  # the previous file's last batch, sent while this one converted
        if result is None:
            self._record(done)
            self._fail(source, prepared.error or "")
            return
        if self.stop.is_set():
            self._record(done)
            return
        requests = result.requests
        d = digest(requests, entry.digest) if entry is not None else None  # else hashed while the first batch sends
        start = 0
        if entry is not None:
            if entry.digest == d and entry.requests == len(requests):
                start = entry.sent
            else:
                _log.warning(
                    "%s converts differently from the ledger's record; importing it from the start", source.path
                )
        self.on_file(source, result, start)
        events, spans = int(result.stats.get("events_total", 0)), int(result.stats.get("spans", 0))
        total = len(requests)
        if start:  # what an earlier run delivered counts as progress already made
            self._advance(nbytes=source.size * start / max(total, 1))
        if start >= total:
            self._record(done)
            entry = Entry(prepared.size, prepared.mtime_ns, prepared.options, d or digest(requests), total, total)
            self.ledger.record(source.key, entry)
            self.report.files_sent += 1
            self._advance(files=1)
            return
        i = start
        while i < total:
            j, size = i, 0
            while j < total and (j == i or size + len(requests[j]) <= self.batch_bytes):
                size += len(requests[j])
                j += 1
            if i > start:  # the previous batch of this file
                done = self._settle()
                if self.stop.is_set() or source.key in self._lost:
                    self._record(done)
                    return
            losses = self.sink.losses()
            for request in requests[i:j]:
                self.sink.submit(request)
            if d is None:
                d = digest(requests)
            requests[i:j] = [b""] * (j - i)  # the exporter holds them now: the next file converts meanwhile
            # counts split by request share; cumulative, so a file's batches add up exactly
            self._pending = _Batch(
                source,
                Entry(prepared.size, prepared.mtime_ns, prepared.options, d, total, j),
                j - i,
                events * j // total - events * i // total,
                spans * j // total - spans * i // total,
                source.size * (j - i) / total,
                j == total,
                losses,
                prepared.times[i:j],
            )
            self._record(done)  # the ledger is written while this batch is sent
            done = None
            i = j

    def _confirm(self) -> None:
        """Wait until the exporter delivered everything submitted; record it."""
        self._record(self._settle())

    def _settle(self) -> _Batch | None:
        """Wait until the exporter delivered everything submitted; the batch it was, to be
        recorded, or None (nothing pending, or some of it was lost: the file fails)."""
        batch, self._pending = self._pending, None
        if batch is None:
            return None
        while not self.sink.flush(timeout_s=0.5):
            pass
        lost = self.sink.losses() - batch.losses_before
        if lost:  # not recorded: --resume sends the batch again
            self._lost.add(batch.source.key)
            self.report.requests_lost += batch.count
            done = batch.entry.sent - batch.count
            self._fail(
                batch.source,
                f"{batch.source.path}: {lost} of the {batch.count} requests of a batch were not delivered "
                f"(see the warning above); {done} of its {batch.entry.requests} requests are recorded as "
                "delivered, --resume sends the rest",
                nbytes=batch.nbytes,
            )
            return None
        return batch

    def _record(self, batch: _Batch | None) -> None:
        """A delivered batch into the ledger, the report and the progress line."""
        if batch is None:
            return
        self.ledger.record(batch.source.key, batch.entry)
        self.report.requests += batch.count
        self.report.events += batch.events
        self.report.spans += batch.spans
        for times in batch.times:
            self.report.dated(times)
        if batch.last:
            self.report.files_sent += 1
        self._advance(events=batch.events, nbytes=batch.nbytes, files=1 if batch.last else 0)

    def _fail(self, source: Source, message: str, nbytes: float | None = None) -> None:
        self.report.files_failed += 1
        self.report.errors.append(message)
        self.on_error(message)
        self._advance(nbytes=source.size if nbytes is None else nbytes, files=1)

    def _advance(self, events: int = 0, nbytes: float = 0.0, files: int = 0) -> None:
        if self.progress is not None:
            self.progress.advance(events, nbytes, files)


__all__ = ["DEFAULT_BATCH_BYTES", "Importer", "Report", "Sink", "SpanTimes", "convert_source", "span_times"]
