"""The import loop: convert each file, hand its requests to the exporter in bounded batches,
and record each batch in the ledger once the exporter has delivered it (sent, or written to
the spool that it replays later).

- A file is converted completely before any of its requests is submitted, so a bad file sends
  nothing.
- A batch is recorded only after ``Exporter.flush`` says the queue is empty and nothing is in
  flight, and only if the exporter lost none of it meanwhile (``losses()``: rejected by the
  backend, refused by an unwritable spool, ...); the ledger therefore never claims a request
  that was or could still be lost, and a resumed import sends what was not confirmed. A file
  with a lost batch stops there (its later batches could not be recorded either): it is a
  failed file, and ``--resume`` sends it from its last recorded batch.
- The next file is converted while the exporter still sends the last batch of the previous
  one (the converter releases the GIL), so conversion and network overlap.
- ``stop`` (set by the CLI on SIGINT/SIGTERM) is honoured between batches: the batch in flight
  is finished and recorded, nothing new is submitted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..converter import ConvertOptions, ConvertResult, TraceFormatError, convert
from .discover import NSYS, Source
from .ledger import Entry, Ledger, digest, fingerprint
from .nsys import convert_nsys
from .progress import Progress

_log = logging.getLogger(__name__)

#: Bytes submitted per batch before waiting for delivery: far below the exporter's 64 MiB
#: queue, so nothing ever takes the overflow path, and a Ctrl-C waits for little.
DEFAULT_BATCH_BYTES = 8 * 1024 * 1024


class Sink(Protocol):
    def submit(self, request: bytes) -> None: ...
    def flush(self, timeout_s: float = 10.0) -> bool: ...
    def losses(self) -> int: ...


def convert_source(source: Source, options: ConvertOptions, engine: str = "auto") -> ConvertResult:
    """One file's requests; raises TraceFormatError (one line, naming the file) for bad input."""
    if source.kind == NSYS:
        return convert_nsys(source.path, options)
    try:
        return convert(source.path, options=options, engine=engine)
    except TraceFormatError as exc:
        message = str(exc)
        raise TraceFormatError(
            message if message.startswith(str(source.path)) else f"{source.path}: {message}"
        ) from None


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


class Importer:
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
        try:
            for source in sources:
                if self.stop.is_set():
                    break
                self._import(source)
            self._confirm()
        finally:
            self.report.stopped = self.stop.is_set()
            self.report.seconds = time.perf_counter() - started
        return self.report

    def _import(self, source: Source) -> None:
        options = self.options_for(source)
        try:
            st = source.path.stat()
        except OSError as exc:
            self._fail(source, f"{source.path}: cannot read ({exc.strerror or exc})")
            return
        fp = fingerprint(f"{source.kind}|{options!r}")
        entry = self.ledger.get(source.key, st.st_size, st.st_mtime_ns, fp) if self.resume else None
        if entry is not None and entry.complete:
            self.report.files_skipped += 1
            self._advance(nbytes=source.size, files=1)
            return
        try:
            result = convert_source(source, options, self.engine)  # the previous batch sends meanwhile
        except (TraceFormatError, RuntimeError) as exc:  # RuntimeError: engine="native" without the module
            self._confirm()
            self._fail(source, " ".join(str(exc).splitlines()))
            return
        self._confirm()
        if self.stop.is_set():
            return
        requests = result.requests
        d = digest(requests)
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
            self.ledger.record(source.key, Entry(st.st_size, st.st_mtime_ns, fp, d, total, total))
            self.report.files_sent += 1
            self._advance(files=1)
            return
        i = start
        while i < total:
            j, size = i, 0
            while j < total and (j == i or size + len(requests[j]) <= self.batch_bytes):
                size += len(requests[j])
                j += 1
            losses = self.sink.losses()
            for request in requests[i:j]:
                self.sink.submit(request)
            # counts split by request share; cumulative, so a file's batches add up exactly
            self._pending = _Batch(
                source,
                Entry(st.st_size, st.st_mtime_ns, fp, d, total, j),
                j - i,
                events * j // total - events * i // total,
                spans * j // total - spans * i // total,
                source.size * (j - i) / total,
                j == total,
                losses,
            )
            i = j
            if i < total:  # the file's last batch is confirmed after the next conversion
                self._confirm()
                if self.stop.is_set() or source.key in self._lost:
                    return

    def _confirm(self) -> None:
        """Wait until the exporter delivered everything submitted; record it."""
        batch, self._pending = self._pending, None
        if batch is None:
            return
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
            return
        self.ledger.record(batch.source.key, batch.entry)
        self.report.requests += batch.count
        self.report.events += batch.events
        self.report.spans += batch.spans
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


__all__ = ["DEFAULT_BATCH_BYTES", "Importer", "Report", "Sink", "convert_source"]
