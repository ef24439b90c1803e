"""The window-conversion thread's queue: a window that finds it full is dropped, counted and its
saved file removed, never blocking the training thread that hands it over."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from otelprof.capture.windows.conversions import Conversions, Job
from otelprof.converter import ConvertOptions


def test_a_full_queue_drops_the_window_counted_and_its_file_removed(tmp_path: Path) -> None:
    gate = threading.Event()

    class StuckResults:  # torch's results, whose save holds the conversion thread
        def save(self, _path: str) -> None:
            gate.wait(30)
            raise RuntimeError("not saved")

    conversions = Conversions(ConvertOptions(), lambda _request: None)
    assert conversions.put(Job(StuckResults(), "schedule"))
    deadline = time.monotonic() + 30
    while not conversions._jobs.empty() and time.monotonic() < deadline:  # the thread took it
        time.sleep(0.01)
    queued = []
    for i in range(4):  # the queue's room
        queued.append(tmp_path / f"{i}.json")
        queued[-1].write_text("{}")
        assert conversions.put(Job(queued[-1], "schedule"))
    extra = tmp_path / "extra.json"
    extra.write_text("{}")
    assert not conversions.put(Job(extra, "schedule"))
    assert not extra.exists() and all(p.exists() for p in queued)
    assert conversions.failed == 1
    gate.set()
    conversions.close()
    assert conversions.failed == 6  # the stuck one and four unreadable traces, each counted once
