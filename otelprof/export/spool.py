"""A bounded, crash-safe directory of pending OTLP requests.

Each request is one file written as temp file -> fsync -> rename, so a process killed mid-write
leaves at most a stray ``*.tmp`` (swept on open), never a half record that replay would send.
Names sort chronologically (``<time>-<pid>-<seq>-<destination>.otlp``; files of otelprof before
destinations have no ``-<destination>``); when the spool would exceed ``max_bytes`` the oldest
records are evicted first, and every eviction is counted.

A spool that cannot be written (read-only, full, its folder impossible to create) never raises:
each refused write returns its reason, is counted, and is logged once per reason.

Spools are private: the folder is 0700, every file 0600, created without following a symlink,
and every access goes through a descriptor of the folder opened without following one and
checked, so the path cannot be swapped in between. A folder that is a symlink, belongs to
another user or that others may write is refused (logged once, every write ``UNSAFE``, nothing
read from it): whoever can plant a record there has it replayed with the victim's credentials.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from . import private
from .destination import NO_DESTINATION, is_destination_id
from .private import Guard

_log = logging.getLogger(__name__)

SUFFIX = ".otlp"
TMP_SUFFIX = ".tmp"
REPLAY_LOCK = ".replay.lock"
DESCRIPTION_PREFIX = "destination-"
DEFAULT_MAX_BYTES = 256 * 1024 * 1024

#: Why a write was refused (the ``reason`` of ``otelprof_export_dropped_requests_total``).
TOO_LARGE = "spool_too_large"
UNWRITABLE = "spool_unwritable"
UNSAFE = "spool_unsafe"

# O_NONBLOCK: a FIFO planted under a record's name must not block the open
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_GUARD = Guard(
    "OTELPROF_SPOOL_DIR",
    owner_could="read your spans and plant requests sent with your credentials",
    others_could="plant requests sent with your credentials",
)


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


class Unsafe(Exception):
    """The spool folder is not private (the message says why and what to do)."""


class _Foreign(Exception):
    """A file in the spool that is not a regular file of ours: never read, never written through."""


def folder_problem(directory: str | os.PathLike[str]) -> str | None:
    """Why ``directory`` may not be used as a spool (None: it may, or does not exist yet)."""
    return _GUARD.lstat_problem(Path(directory))


class Spool:
    """Thread-safe within a process; several processes may share a directory (names carry the pid)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.counters = SpoolCounters()
        #: Why the folder was refused (logged once); then nothing is written to or read from it.
        self.unsafe: str | None = None
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._warned: set[str] = set()
        self._described: set[str] = set()
        self._tightened = False
        try:
            with self._folder(create=True) as fd:
                for name in os.listdir(fd):
                    if name.endswith(TMP_SUFFIX) and not _writer_alive(name):  # a crash's; live writers keep theirs
                        with suppress(OSError):
                            os.unlink(name, dir_fd=fd)
        except Unsafe:
            pass  # logged; the exporter runs on without a spool, each write counted
        except OSError as exc:  # the exporter runs on without a spool; each write retries
            self._warn_once(UNWRITABLE, f"spool {self.directory} is unusable: {exc.strerror or exc}")

    def after_fork(self) -> None:
        """A forked child's lock: a parent thread may have held it at the fork."""
        self._lock = threading.Lock()

    def records(self, destination: str | None = None, *, legacy: bool = False) -> list[Path]:
        """Complete records, oldest first: all of them, or those spooled for ``destination``
        (plus, with ``legacy``, those of older versions, which name no destination)."""
        try:
            with self._folder() as fd:
                found = [self.directory / name for name in _names(fd)]
        except (OSError, Unsafe):
            return []
        if destination is None:
            return found
        return [p for p in found if (d := record_destination(p)) == destination or (legacy and d is None)]

    def bytes_used(self) -> int:
        try:
            with self._folder() as fd:
                return sum(_size(fd, name) for name in _names(fd))
        except (OSError, Unsafe):
            return 0

    def write(self, request: bytes, destination: str = NO_DESTINATION) -> bool:
        """Stores one request durably; False (counted, logged once) when the disk refuses it."""
        return self.store(request, destination) is None

    def store(
        self, request: bytes, destination: str = NO_DESTINATION, description: Mapping[str, object] | None = None
    ) -> str | None:
        """Like :meth:`write`, returning None when stored, else why not (``TOO_LARGE``,
        ``UNWRITABLE``, ``UNSAFE``). Never raises. ``description`` (nothing secret) is kept once
        per destination for ``otelprof spool ls``."""
        if len(request) > self.max_bytes:
            return self._failed(
                TOO_LARGE, f"a {len(request)}-byte request exceeds the spool limit of {self.max_bytes} bytes"
            )
        if not is_destination_id(destination):
            raise ValueError(f"not a destination id: {destination!r}")
        with self._lock:
            name = f"{time.time_ns():020d}-{os.getpid():07d}-{next(self._seq):09d}-{destination}"
            try:
                with self._folder(create=True) as fd:  # created again if it went away
                    self._make_room(fd, len(request))
                    _write_new(fd, name + TMP_SUFFIX, request)
                    try:
                        os.replace(name + TMP_SUFFIX, name + SUFFIX, src_dir_fd=fd, dst_dir_fd=fd)
                    except OSError:
                        with suppress(OSError):
                            os.unlink(name + TMP_SUFFIX, dir_fd=fd)
                        raise
                    _fsync(fd)
                    self.counters.written += 1
                    if description is not None and destination not in self._described:
                        self._described.add(destination)
                        self._describe(fd, destination, description)
            except Unsafe as exc:
                return self._failed(UNSAFE, str(exc))
            except OSError as exc:  # full disk, read-only mount, not a folder, ...
                return self._failed(UNWRITABLE, f"cannot write to {self.directory}: {exc.strerror or exc}")
            return None

    def describe(self, destination: str) -> dict[str, object] | None:
        """What the writer of ``destination``'s records said about it (see :meth:`store`)."""
        try:
            doc = json.loads(self._read(f"{DESCRIPTION_PREFIX}{destination}.json").decode("utf-8"))
        except (OSError, ValueError, Unsafe, _Foreign):
            return None
        return doc if isinstance(doc, dict) else None

    def __iter__(self) -> Iterator[tuple[Path, bytes]]:
        """(record, request bytes), oldest first; records removed meanwhile are skipped."""
        return self.read(self.records())

    def read(self, records: list[Path]) -> Iterator[tuple[Path, bytes]]:
        """Only regular files of ours (by name, in this folder); anything else is skipped,
        logged once."""
        for path in records:
            try:
                data = self._read(path.name)
            except (FileNotFoundError, Unsafe):
                continue
            except (OSError, _Foreign) as exc:
                why = exc.strerror if isinstance(exc, OSError) else exc
                self._warn_once("skipped", f"spool record {path} skipped: {why} (further ones are only skipped)")
                continue
            yield path, data

    def remove(self, record: Path) -> bool:
        """False (logged once) when the record cannot be deleted (a read-only spool)."""
        try:
            with self._folder() as fd:
                os.unlink(record.name, dir_fd=fd)
        except FileNotFoundError:
            return True
        except Unsafe:
            return False
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
            with self._folder() as dir_fd:
                fd = _open_own(dir_fd, REPLAY_LOCK, os.O_RDWR | os.O_CREAT)
        except _Foreign as exc:  # never a lock file through a planted symlink
            self._warn_once("lock", f"not locking {self.directory / REPLAY_LOCK} ({exc}): replaying unguarded")
            fd = -1
        except (OSError, Unsafe):  # read-only: unguarded rather than never; unsafe: nothing to replay
            fd = -1
        if fd < 0:
            yield True
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

    @contextmanager
    def _folder(self, create: bool = False) -> Iterator[int]:
        """A descriptor of the spool folder, opened without following a symlink and checked
        private (else ``Unsafe``, logged once and for good); OSError when it cannot be opened."""
        if self.unsafe is not None:
            raise Unsafe(self.unsafe)
        with private.opened(self.directory, _GUARD, self._refuse, self._tighten, make=create) as fd:
            yield fd

    def _tighten(self, fd: int, mode: int) -> None:
        """Our folder, readable by others (an older otelprof made it 0755): no access but ours,
        and its files 0600. Once; a read-only mount refuses, and is used as it is."""
        if self._tightened:
            return
        self._tightened = True
        with suppress(OSError):
            os.fchmod(fd, mode)
            for name in os.listdir(fd):
                with suppress(OSError, _Foreign):
                    os.close(_open_own(fd, name, os.O_RDONLY))  # chmods it 0600

    def _refuse(self, problem: str) -> NoReturn:
        self.unsafe = problem
        self._warn_once(
            UNSAFE, f"spool folder refused: {problem}; nothing is spooled meanwhile (each request counted as {UNSAFE})"
        )
        raise Unsafe(problem)

    def _read(self, name: str) -> bytes:
        with self._folder() as dir_fd, os.fdopen(_open_own(dir_fd, name, os.O_RDONLY), "rb") as handle:
            return handle.read()

    def _make_room(self, fd: int, incoming: int) -> None:
        names = _names(fd)
        sizes = [_size(fd, name) for name in names]
        used = sum(sizes)
        for oldest, size in zip(names, sizes, strict=True):
            if used + incoming <= self.max_bytes:
                break
            used -= size  # gone, whoever removed it
            try:
                os.unlink(oldest, dir_fd=fd)
            except FileNotFoundError:  # another process evicted (or replayed) it first: theirs to count
                continue
            self.counters.evicted += 1
            self.counters.evicted_bytes += size
            if self.counters.evicted == 1:
                _log.warning(
                    "spool %s is full (%d bytes): evicting the oldest requests", self.directory, self.max_bytes
                )

    def _describe(self, fd: int, destination: str, description: Mapping[str, object]) -> None:
        """Best effort: a spool without descriptions still replays; ``ls`` shows only ids."""
        name = f"{DESCRIPTION_PREFIX}{destination}.json"
        tmp = f"{time.time_ns():020d}-{os.getpid():07d}-{next(self._seq):09d}-{name}{TMP_SUFFIX}"  # swept as records
        try:
            _write_new(fd, tmp, json.dumps(dict(description), sort_keys=True).encode("utf-8"))
        except OSError:
            return
        try:
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=fd)

    def _failed(self, reason: str, why: str) -> str:
        self.counters.failed_writes += 1
        self._warn_once(reason, f"spool write failed: {why} (further failures are only counted)")
        return reason

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log.warning("%s", message)


def _open_own(dir_fd: int, name: str, flags: int) -> int:
    """``name`` in the folder, never through a symlink, only a regular file of ours (made 0600)."""
    try:
        fd = os.open(name, flags | _FILE_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Foreign("a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Foreign("not a regular file")
        if st.st_uid != os.geteuid():
            raise _Foreign(f"owned by uid {st.st_uid}, not by you")
        if st.st_mode & 0o077:  # written by an older otelprof
            with suppress(OSError):
                os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    """A new file (never an existing one, nor through a symlink), 0600, on disk when this returns."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError:  # full disk, file size limit: no half record left behind
        with suppress(OSError):  # on a read-only mount unlink fails too
            os.unlink(name, dir_fd=dir_fd)
        raise


def _names(dir_fd: int) -> list[str]:
    return sorted(name for name in os.listdir(dir_fd) if name.endswith(SUFFIX))


def _writer_alive(tmp: str) -> bool:
    """Temp file names carry the writer's pid: ``<time>-<pid>-<seq>-...``; this process's are a
    crash's of an earlier one that had its pid."""
    try:
        pid = int(tmp.split("-")[1])
    except (IndexError, ValueError):
        return False
    return pid != os.getpid() and private.pid_alive(pid)


def _size(dir_fd: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
    except OSError:
        return 0


def _fsync(dir_fd: int) -> None:
    """Makes the rename itself durable (POSIX). The record's data is already on disk, so a
    directory that cannot be synced only weakens that guarantee: not a failure."""
    with suppress(OSError):
        os.fsync(dir_fd)
