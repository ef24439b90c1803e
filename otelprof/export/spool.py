"""A bounded, crash-safe directory of pending OTLP requests.

Each request is one file written as temp file -> fsync -> rename, so a process killed mid-write
leaves at most a stray ``*.tmp`` (swept on open), never a half record that replay would send.
Names sort chronologically (``<time>-<pid>-<seq>-<destination>.otlp``; files of otelprof before
destinations have no ``-<destination>``); when the spool would exceed ``max_bytes`` the oldest
records are evicted first, and every eviction is counted.

A spool that cannot be written (read-only, full, its folder impossible to create) never raises:
each refused write returns its reason, is counted, and is logged once per reason.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from .destination import NO_DESTINATION, is_destination_id

_log = logging.getLogger(__name__)

SUFFIX = ".otlp"
TMP_SUFFIX = ".tmp"
REPLAY_LOCK = ".replay.lock"
DESCRIPTION_PREFIX = "destination-"
DEFAULT_MAX_BYTES = 256 * 1024 * 1024

#: Why a write was refused (the ``reason`` of ``otelprof_export_dropped_requests_total``).
TOO_LARGE = "spool_too_large"
UNWRITABLE = "spool_unwritable"


@dataclass
class SpoolCounters:
    written: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    failed_writes: int = 0


def record_destination(record: Path) -> str | None:
    """The destination id in a record's name; None for records written before destinations."""
    parts = record.name.removesuffix(SUFFIX).split("-")
    return parts[3] if len(parts) == 4 and is_destination_id(parts[3]) else None


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
        self._warned: set[str] = set()
        self._described: set[str] = set()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for stray in self.directory.glob(f"*{TMP_SUFFIX}"):
                if not _writer_alive(stray):  # a write a crash interrupted; live writers keep theirs
                    stray.unlink(missing_ok=True)
        except OSError as exc:  # the exporter runs on without a spool; each write retries
            self._warn_once(UNWRITABLE, f"spool {self.directory} is unusable: {exc.strerror or exc}")

    def after_fork(self) -> None:
        """A forked child's lock: a parent thread may have held it at the fork."""
        self._lock = threading.Lock()

    def records(self, destination: str | None = None, *, legacy: bool = False) -> list[Path]:
        """Complete records, oldest first: all of them, or those spooled for ``destination``
        (plus, with ``legacy``, those of older versions, which name no destination)."""
        try:
            found = sorted(self.directory.glob(f"*{SUFFIX}"))
        except OSError:
            return []
        if destination is None:
            return found
        return [p for p in found if (d := record_destination(p)) == destination or (legacy and d is None)]

    def bytes_used(self) -> int:
        return sum(_size(p) for p in self.records())

    def write(self, request: bytes, destination: str = NO_DESTINATION) -> bool:
        """Stores one request durably; False (counted, logged once) when the disk refuses it."""
        return self.store(request, destination) is None

    def store(
        self, request: bytes, destination: str = NO_DESTINATION, description: Mapping[str, object] | None = None
    ) -> str | None:
        """Like :meth:`write`, returning None when stored, else why not (``TOO_LARGE``,
        ``UNWRITABLE``). Never raises. ``description`` (nothing secret) is kept once per
        destination for ``otelprof spool ls``."""
        if len(request) > self.max_bytes:
            return self._failed(
                TOO_LARGE, f"a {len(request)}-byte request exceeds the spool limit of {self.max_bytes} bytes"
            )
        if not is_destination_id(destination):
            raise ValueError(f"not a destination id: {destination!r}")
        with self._lock:
            name = f"{time.time_ns():020d}-{os.getpid():07d}-{next(self._seq):09d}-{destination}"
            final = self.directory / (name + SUFFIX)
            tmp = self.directory / (name + TMP_SUFFIX)
            try:
                self.directory.mkdir(parents=True, exist_ok=True)  # gone, or not creatable at start
                self._make_room(len(request))
                with open(tmp, "wb") as handle:
                    handle.write(request)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, final)
            except OSError as exc:  # full disk, read-only mount, not a folder, ...
                with suppress(OSError):  # on a read-only mount unlink fails too
                    tmp.unlink(missing_ok=True)
                return self._failed(UNWRITABLE, f"cannot write to {self.directory}: {exc.strerror or exc}")
            _fsync_dir(self.directory)
            self.counters.written += 1
            if description is not None and destination not in self._described:
                self._described.add(destination)
                self._describe(destination, description)
            return None

    def describe(self, destination: str) -> dict[str, object] | None:
        """What the writer of ``destination``'s records said about it (see :meth:`store`)."""
        try:
            doc = json.loads((self.directory / f"{DESCRIPTION_PREFIX}{destination}.json").read_text("utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def __iter__(self) -> Iterator[tuple[Path, bytes]]:
        """(record, request bytes), oldest first; records removed meanwhile are skipped."""
        return self.read(self.records())

    def read(self, records: list[Path]) -> Iterator[tuple[Path, bytes]]:
        for path in records:
            try:
                yield path, path.read_bytes()
            except FileNotFoundError:
                continue

    def remove(self, record: Path) -> bool:
        """False (logged once) when the record cannot be deleted (a read-only spool)."""
        try:
            record.unlink(missing_ok=True)
        except OSError as exc:
            self._warn_once("remove", f"cannot remove {record} from the spool: {exc.strerror or exc}")
            return False
        return True

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

    def _describe(self, destination: str, description: Mapping[str, object]) -> None:
        """Best effort: a spool without descriptions still replays; ``ls`` shows only ids."""
        path = self.directory / f"{DESCRIPTION_PREFIX}{destination}.json"
        tmp = path.with_name(f"{path.name}.{os.getpid()}{TMP_SUFFIX}")
        try:
            tmp.write_text(json.dumps(dict(description), sort_keys=True), "utf-8")
            os.replace(tmp, path)
        except OSError:
            with suppress(OSError):
                tmp.unlink(missing_ok=True)

    def _failed(self, reason: str, why: str) -> str:
        self.counters.failed_writes += 1
        self._warn_once(reason, f"spool write failed: {why} (further failures are only counted)")
        return reason

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log.warning("%s", message)


def _writer_alive(tmp: Path) -> bool:
    """Record names carry the writer's pid: ``<time>-<pid>-<seq>[-<destination>]``."""
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
    except OSError:
        return 0


def _fsync_dir(directory: Path) -> None:
    """Makes the rename itself durable (POSIX). The record's data is already on disk, so a
    directory that cannot be opened or synced only weakens that guarantee: not a failure."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
