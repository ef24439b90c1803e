"""A bounded, crash-safe directory of pending OTLP requests.

Each request is one file written as temp file -> fsync -> rename, so a process killed mid-write
leaves at most a stray ``*.tmp`` (swept on open), never a half record that replay would send.
Names sort chronologically; when the spool would exceed ``max_bytes`` the oldest records are
evicted first, and every eviction is counted.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_log = logging.getLogger(__name__)

SUFFIX = ".otlp"
TMP_SUFFIX = ".tmp"
REPLAY_LOCK = ".replay.lock"
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass
class SpoolCounters:
    written: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    failed_writes: int = 0


class Spool:
    """Thread-safe within a process; several processes may share a directory (names carry the pid)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.counters = SpoolCounters()
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self.directory.mkdir(parents=True, exist_ok=True)
        for stray in self.directory.glob(f"*{TMP_SUFFIX}"):
            if not _writer_alive(stray):  # a write a crash interrupted; live writers keep theirs
                stray.unlink(missing_ok=True)

    def records(self) -> list[Path]:
        """Complete records, oldest first."""
        return sorted(self.directory.glob(f"*{SUFFIX}"))

    def bytes_used(self) -> int:
        return sum(_size(p) for p in self.records())

    def write(self, request: bytes) -> bool:
        """Stores one request durably; False (counted, logged) when the disk refuses it."""
        if len(request) > self.max_bytes:
            self._note_failure(f"a {len(request)}-byte request exceeds the spool limit of {self.max_bytes} bytes")
            return False
        with self._lock:
            self._make_room(len(request))
            name = f"{time.time_ns():020d}-{os.getpid():07d}-{next(self._seq):09d}"
            final = self.directory / (name + SUFFIX)
            tmp = self.directory / (name + TMP_SUFFIX)
            try:
                with open(tmp, "wb") as handle:
                    handle.write(request)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, final)
                _fsync_dir(self.directory)
            except OSError as exc:  # full disk, read-only mount, ...
                tmp.unlink(missing_ok=True)
                self._note_failure(f"cannot write to {self.directory}: {exc.strerror or exc}")
                return False
            self.counters.written += 1
            return True

    def __iter__(self) -> Iterator[tuple[Path, bytes]]:
        """(record, request bytes), oldest first; records removed meanwhile are skipped."""
        for path in self.records():
            try:
                yield path, path.read_bytes()
            except FileNotFoundError:
                continue

    def remove(self, record: Path) -> None:
        record.unlink(missing_ok=True)

    @contextmanager
    def replay_lock(self) -> Iterator[bool]:
        """Yields True when this process may replay: one replayer per directory at a time, so
        processes sharing a spool (ranks, forked workers, the CLI) do not send a record twice.
        The kernel releases the lock when its holder dies."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: single-process use only
            yield True
            return
        try:
            fd = os.open(self.directory / REPLAY_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield True  # cannot create the lock (read-only dir): replay unguarded rather than never
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    def _make_room(self, incoming: int) -> None:
        records = self.records()
        used = sum(_size(p) for p in records)
        for oldest in records:
            if used + incoming <= self.max_bytes:
                break
            size = _size(oldest)
            oldest.unlink(missing_ok=True)
            used -= size
            self.counters.evicted += 1
            self.counters.evicted_bytes += size
            if self.counters.evicted == 1:
                _log.warning(
                    "spool %s is full (%d bytes): evicting the oldest requests", self.directory, self.max_bytes
                )

    def _note_failure(self, why: str) -> None:
        self.counters.failed_writes += 1
        if self.counters.failed_writes == 1:
            _log.warning("spool write failed: %s (further failures are only counted)", why)


def _writer_alive(tmp: Path) -> bool:
    """Record names carry the writer's pid: ``<time>-<pid>-<seq>``."""
    try:
        pid = int(tmp.name.split("-")[1])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _fsync_dir(directory: Path) -> None:
    """Makes the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
