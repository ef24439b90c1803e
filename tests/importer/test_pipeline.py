"""The import loop's pipeline (session.py), against a fake exporter: the next files convert
while this one's batches are sent, what converts ahead is bounded, and the ledger still never
records a request before the exporter delivered it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from otelprof.converter import ConvertOptions, ConvertResult
from otelprof.importer import Importer, Ledger, find_sources
from otelprof.importer.ledger import Entry
from otelprof.importer.session import _Ahead, _Prepared, convert_source

from .helpers import SHARED, shared

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")

#: Small requests and batches: several batches per file.
OPTIONS = ConvertOptions(detail="full", max_request_bytes=16 * 1024)
BATCH = 48 * 1024


class Sink:
    """Delivers everything at flush; ``lose`` requests are lost at the flush of batch ``lose_at``."""

    def __init__(self, lose_at: int = 0, lose: int = 0, on_flush: Any = None) -> None:
        self.submitted: list[bytes] = []
        self.delivered = 0
        self.flushes = 0
        self.lost = 0
        self._lose_at, self._lose, self._on_flush = lose_at, lose, on_flush

    def submit(self, request: bytes) -> None:
        self.submitted.append(request)

    def flush(self, timeout_s: float = 10.0) -> bool:
        self.flushes += 1
        if self._on_flush is not None:
            self._on_flush(self)
        if self.flushes == self._lose_at:
            self.lost += self._lose
        self.delivered = len(self.submitted)
        return True

    def losses(self) -> int:
        return self.lost


class CheckedLedger(Ledger):
    """Fails the test if an entry claims more than the sink delivered."""

    def __init__(self, path: Path, sink: Sink) -> None:
        super().__init__(path)
        self.sink = sink
        self.records: list[tuple[str, int]] = []

    def record(self, key: str, entry: Entry) -> None:
        previous = self.entries.get(key)
        super().record(key, entry)
        self.records.append((key, entry.sent))
        claimed = sum(e.sent for e in self.entries.values())
        assert claimed <= self.sink.delivered, f"ledger claims {claimed} requests, {self.sink.delivered} delivered"
        assert previous is None or entry.sent >= previous.sent


def _files() -> list[Path]:
    return [shared("alexnet"), shared("amd_trace"), shared("sampled_rank-0")]


def _importer(sink: Sink, ledger: Ledger, **kwargs: Any) -> Importer:
    return Importer(sink, ledger, lambda source: OPTIONS, batch_bytes=BATCH, **kwargs)


def test_every_request_in_order_and_the_ledger_never_ahead_of_delivery(tmp_path: Path) -> None:
    sources = find_sources(_files())
    sink = Sink()
    ledger = CheckedLedger(tmp_path / "ledger.json", sink)
    results: list[Any] = []
    report = _importer(sink, ledger, on_file=lambda source, result, start: results.append(result)).run(sources)
    want = [r for s in sources for r in convert_source(s, OPTIONS).requests]  # (an import's resource)
    assert sink.submitted == want and report.requests == len(want) and report.files_sent == len(sources)
    assert all(r == b"" for result in results for r in result.requests)  # let go of once submitted
    assert all(e.complete for e in ledger.entries.values()) and len(ledger.entries) == len(sources)
    assert sink.flushes > len(sources)  # several batches per file, each confirmed


def test_the_next_file_converts_while_this_ones_batches_are_sent(tmp_path: Path) -> None:
    sources = find_sources(_files())
    started: list[str] = []
    second_started = threading.Event()

    def options_for(source: Any) -> ConvertOptions:  # called on the conversion thread, first thing
        started.append(source.key)
        if len(started) == 2:
            second_started.set()
        return OPTIONS

    seen_at_first_flush: list[bool] = []

    def on_flush(sink: Sink) -> None:
        if not seen_at_first_flush:  # the first file's first batch: the second file is being prepared
            seen_at_first_flush.append(second_started.wait(timeout=30))  # a guard, not a threshold

    sink = Sink(on_flush=on_flush)
    report = Importer(sink, Ledger(tmp_path / "ledger.json"), options_for, batch_bytes=BATCH).run(sources)
    assert seen_at_first_flush == [True] and report.files_sent == len(sources)
    assert started == [s.key for s in sources]


def test_a_lost_batch_fails_its_file_and_only_what_was_delivered_is_recorded(tmp_path: Path) -> None:
    sources = find_sources(_files())
    sink = Sink(lose_at=2, lose=1)  # the first file's second batch
    ledger = CheckedLedger(tmp_path / "ledger.json", sink)
    errors: list[str] = []
    report = _importer(sink, ledger, on_error=errors.append).run(sources)
    first = sources[0].key
    assert report.files_failed == 1 and report.files_sent == len(sources) - 1
    assert len(errors) == 1 and errors[0].startswith(f"{sources[0].path}: 1 of the ")
    first_batch = [sent for key, sent in ledger.records if key == first]
    assert len(first_batch) == 1 and not ledger.entries[first].complete  # batch 1 recorded, batch 2 not
    assert all(ledger.entries[s.key].complete for s in sources[1:])
    assert report.requests_lost > 0


def test_stop_finishes_the_batch_in_flight_and_submits_nothing_new(tmp_path: Path) -> None:
    sources = find_sources(_files())
    stop = threading.Event()
    sink = Sink(on_flush=lambda sink: stop.set())
    ledger = CheckedLedger(tmp_path / "ledger.json", sink)
    report = _importer(sink, ledger, stop=stop).run(sources)
    assert report.stopped and sink.flushes == 1
    assert ledger.records == [(sources[0].key, report.requests)] and len(sink.submitted) == report.requests


def test_conversion_ahead_stops_at_its_budget() -> None:
    calls: list[int] = []

    def prepare(source: Any) -> _Prepared:
        calls.append(source)
        return _Prepared(source, result=ConvertResult([b"x" * 10], [], {}, "native"))

    ahead = _Ahead(prepare, list(range(10)), budget=30, stop=threading.Event())  # type: ignore[arg-type]
    first = ahead.take()
    assert first is not None and first.source == 0  # type: ignore[comparison-overlap]
    for _ in range(1000):  # wait (a guard, not a threshold) until the budget is reached
        if len(calls) >= 4 and all(f.done() for f in list(ahead._futures)):
            break
        threading.Event().wait(0.01)
    ahead.close()
    assert 4 <= len(calls) <= 5  # 0 taken, 1-3 held (30 bytes), one more may start before the last lands
    assert len(calls) < 10
