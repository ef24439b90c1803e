"""Spooling requests the full export queue cannot take, off the producer's thread.

Writing a spool record means an fsync, which a slow or full disk can stall for seconds; the
training thread that called ``submit()`` must never wait for that. This writer has its own byte
bound: when it is full too, the request is dropped (the caller counts it).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable


class OverflowWriter:
    _cond: threading.Condition
    _pending: deque[bytes]
    _bytes: int
    _closed: bool
    _thread: threading.Thread | None

    def __init__(self, write: Callable[[bytes], None], max_bytes: int) -> None:
        self._write = write
        self._max_bytes = max_bytes
        self._start()

    def put(self, request: bytes) -> bool:
        """Queues ``request`` for the spool; False (nothing queued) when the writer is full."""
        with self._cond:
            if self._closed or self._bytes + len(request) > self._max_bytes:
                return False
            self._pending.append(request)
            self._bytes += len(request)
            if self._thread is None:  # started on first use: most jobs never overflow
                thread = threading.Thread(target=self._run, name="otelprof-spool-writer", daemon=True)
                thread.start()
                self._thread = thread
            self._cond.notify()
            return True

    def close(self, timeout_s: float) -> list[bytes]:
        """Writes what is pending for up to ``timeout_s`` and stops the thread; returns what it
        did not get to, oldest first (the caller spools or counts it: nothing is lost unseen)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(timeout_s, 0.0))
        with self._cond:  # a write in progress stays the thread's; the rest is the caller's
            left = list(self._pending)
            self._pending.clear()
            self._bytes = 0
        return left

    def after_fork(self) -> None:
        """A forked child gets its own empty writer (the parent's thread does not exist there)."""
        self._start()

    def _start(self) -> None:
        self._cond = threading.Condition()
        self._pending = deque()
        self._bytes = 0
        self._closed = False
        self._thread = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                request = self._pending.popleft()
                self._bytes -= len(request)
            self._write(request)  # the exporter's _to_spool never raises
