"""Saved profiling windows, converted and submitted on a thread of otelprof's own.

One thread, started when the first window begins (a process that never profiles has none), niced so
the training thread gets the CPU first, and run on one converter thread: a window's conversion
runs beside training and must not take a second core. ``pause()`` stops it once what is queued
is converted (see ``coexist.quiet``); the next trace starts another. otelprof's own windows
(``profiling.py``) and the user's (``handler.py``) both come here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...converter import ConvertOptions, LiveStep, convert
from ...converter._options import LiveMatch
from ..metrics.window_metrics import WindowMetrics, summarize

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Job:
    """A window to convert: torch's results (saved on the conversion thread) or a saved file."""

    source: Any
    trigger: str  # early, schedule, on_demand, anomaly; user: the user's own profiler's
    live: tuple[LiveStep, ...] = ()
    live_match: LiveMatch = "number"  # "time" for the user's windows: their steps have their own numbers


class Conversions:
    def __init__(
        self,
        options: ConvertOptions,
        submit: Callable[[bytes], None],
        metrics: WindowMetrics | None = None,
    ) -> None:
        self._options = dataclasses.replace(options, threads=1)
        self._submit = submit
        self.metrics = metrics
        self.save_threads: deque[str] = deque(maxlen=16)  # where each window's trace was saved
        self.done = 0
        self.failed = 0
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=4)
        self._worker: threading.Thread | None = None
        self._stopping: list[threading.Thread] = []  # paused ones, leaving once their jobs are done
        self._full_logged = False

    @property
    def options(self) -> ConvertOptions:
        return self._options

    def ready(self) -> None:
        """Starts the thread ahead of a window's end: a thread started there would take the GIL
        from the training thread in the step that pays the window's stop."""
        with self._lock:
            if self._worker is None:
                self._start_worker()

    def put(self, job: Job) -> bool:
        """Queues a window; False when windows arrive faster than they convert: the window is
        dropped (counted, its saved file removed, logged once)."""
        with self._lock:
            if self._worker is None:
                self._start_worker()
            try:
                self._jobs.put_nowait(job)
                return True
            except queue.Full:
                pass
        self.count_failure()
        if isinstance(job.source, Path):
            job.source.unlink(missing_ok=True)
        if not self._full_logged:
            self._full_logged = True
            _log.warning("otelprof: windows arrive faster than they convert; dropping them (counted)")
        return False

    def count_failure(self) -> None:
        self.failed += 1
        if self.metrics is not None:
            self.metrics.window_failed()

    def pause(self, wait_s: float) -> None:
        """Stops the thread once it has converted what is queued, waiting up to ``wait_s``."""
        with self._lock:
            worker, self._worker = self._worker, None
            if worker is None:
                return
            self._jobs.put(None)  # each thread leaves at one None: as many as were asked to stop
            self._stopping.append(worker)
        worker.join(wait_s)

    def close(self, timeout_s: float = 60.0) -> None:
        """Converts what is queued and stops every thread."""
        with self._lock:
            worker, stopping = self._worker, self._stopping
            if worker is None and not self._jobs.empty():
                worker = self._start_worker()  # a trace queued behind a pause's stop
            self._worker, self._stopping = None, []
        if worker is not None:
            self._jobs.put(None)
        for thread in [*stopping, worker]:
            if thread is not None:
                thread.join(timeout=timeout_s)

    def _start_worker(self) -> threading.Thread:
        worker = self._worker = threading.Thread(target=self._run, name="otelprof-windows", daemon=True)
        worker.start()
        return worker

    def _run(self) -> None:
        _lower_priority()
        while (job := self._jobs.get()) is not None:
            path: Path | None = job.source if isinstance(job.source, Path) else None
            try:
                if path is None:
                    path = temp_path()
                    job.source.save(str(path))  # Kineto writes the JSON with the GIL released
                    self.save_threads.append(threading.current_thread().name)
                options = self._options
                if job.live:
                    options = dataclasses.replace(options, live_steps=job.live, live_match=job.live_match)
                trigger = job.trigger
                job = None  # torch's results are freed here, on this thread
                result = convert(path, options=options)
                for request in result.requests:
                    self._submit(request)
                self.done += 1
                if self.metrics is not None:
                    self.metrics.window_done(trigger, summarize(result.ops))
            except Exception:
                self.count_failure()
                _log.warning("otelprof: converting a profiling window failed", exc_info=True)
            finally:
                job = None
                if path is not None:
                    path.unlink(missing_ok=True)


def temp_path(suffix: str = ".json") -> Path:
    fd, name = tempfile.mkstemp(prefix="otelprof-window-", suffix=suffix)
    os.close(fd)
    return Path(name)


#: Niceness of the conversion thread: on a machine with few free cores the training thread
#: gets the CPU first, and the window's conversion takes the time left over.
CONVERT_NICENESS = 10


def _lower_priority() -> None:
    """Linux schedules threads one by one: this lowers the calling thread only."""
    with contextlib.suppress(AttributeError, OSError):
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, current + CONVERT_NICENESS))
