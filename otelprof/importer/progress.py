"""A one-line progress display on stderr: files, percent of input bytes, events/s, ETA.

Hand-written rather than tqdm: one line, redrawn at most ``rate_hz`` times a second, is all
an import needs, and the package keeps its core dependencies few.
"""

from __future__ import annotations

import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO, files: int, total_bytes: int, enabled: bool, rate_hz: float = 5.0) -> None:
        self.stream = stream
        self.enabled = enabled
        self.files = files
        self.total_bytes = max(total_bytes, 1)
        self.files_done = 0
        self.bytes_done = 0.0
        self.events = 0
        self._started = time.monotonic()
        self._interval = 1.0 / rate_hz
        self._last = 0.0
        self._shown = False

    def advance(self, events: int = 0, nbytes: float = 0.0, files: int = 0) -> None:
        self.events += events
        self.bytes_done += nbytes
        self.files_done += files
        now = time.monotonic()
        if self.enabled and (now - self._last >= self._interval or self.files_done == self.files):
            self._last = now
            self._draw(now)

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self._started, 1e-9)
        fraction = min(self.bytes_done / self.total_bytes, 1.0)
        rate = self.events / elapsed
        width = 20
        bar = "#" * round(fraction * width)
        eta = f"{elapsed * (1 - fraction) / fraction:.0f}s" if 0 < fraction < 1 else "-"
        return (
            f"import [{bar:<{width}}] {fraction:4.0%}  {self.files_done}/{self.files} files  "
            f"{self.events:,} events  {rate:,.0f} events/s  ETA {eta}"
        )

    def _draw(self, now: float) -> None:
        self.stream.write(f"\r{self.line(now)}\x1b[K")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        """Ends the line, so messages printed after it start on their own."""
        if self._shown:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False
