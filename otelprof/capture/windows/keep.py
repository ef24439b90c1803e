"""Each live window's raw Kineto trace, kept gzip-compressed beside the spans made of it.

The readable trace is a summary (a span budget, roll-ups); the kept file is the whole window,
for Perfetto, TensorBoard, HTA or ``otelprof convert``. Its path goes on the window's trace
roots (``otelprof.source.file``). On by default and bounded: the last ``count`` windows of
each rank (ranks of a host sharing the folder keep theirs each) and ``max_bytes`` in the
folder, oldest removed first. Only otelprof's own windows are kept; the user's profiler
windows (``trace_handler()``) are the user's.

Written on the conversion thread (zlib releases the GIL) as temp file -> rename, so a crash
leaves no half trace under a final name. The folder is private as the spool's is: made 0700,
files 0600, nothing followed through a symlink, and a folder that is a symlink, another
user's or writable by others is refused. Nothing here harms the job: a file not kept (full
disk, unwritable or refused folder, a trace bigger than the bound) is logged once per reason
and counted (``otelprof_window_traces_not_kept_total``); the window is converted and sent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NoReturn

from ...export import private
from ...export.private import Guard
from ...settings import value
from ...settings.variables import OTELPROF_KEEP_TRACES, OTELPROF_KEEP_TRACES_MAX_BYTES, OTELPROF_TRACE_DIR

_log = logging.getLogger(__name__)

SUFFIX = ".pt.trace.json.gz"  # the name TensorBoard's profiler plugin and HTA look for
DEFAULT_COUNT = 5
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
#: zlib level 1: about 400 MB/s and 13x smaller on Kineto's JSON (level 6: half the speed, a
#: quarter smaller), beside a training loop on the conversion thread
LEVEL = 1
CHUNK = 1 << 20

#: Why a trace was not kept (the log line's key; the counter sums them).
UNWRITABLE, UNSAFE, TOO_LARGE = "unwritable", "unsafe", "too_large"

_GUARD = Guard(
    "OTELPROF_TRACE_DIR",
    owner_could="read your program's traces and replace those otelprof reads back",
    others_could="replace the traces kept there",
)
# <run>_rank<r>[_step<n>]_<UTC time>.pt.trace.json.gz: the time orders them
_NAME = re.compile(r"_rank(\d+)(?:_step\d+)?_(\d{8}T\d{6}\.\d{3}Z)" + re.escape(SUFFIX) + "$")
_TEMP = re.compile(r"^\.keep-(\d+)-\d+\.tmp$")
#: Files a window's profiles (capture/profiles/) write beside its kept trace, named as it is with
#: these ends for its own: they go with it, and count in the folder's bytes.
COMPANIONS = (".pprof.gz", ".collapsed.txt", ".device.collapsed.txt", ".et.json.gz")
#: The window's execution trace (the ``execution_trace`` profile option), gzip-compressed.
EXECUTION_TRACE = ".et.json.gz"


def companion(kept: str, suffix: str) -> str:
    """The name of ``kept``'s companion file with ``suffix``."""
    return kept.removesuffix(SUFFIX) + suffix


@dataclass(frozen=True)
class KeepSettings:
    count: int = DEFAULT_COUNT  # per rank; 0: nothing kept
    max_bytes: int = DEFAULT_MAX_BYTES  # in the folder
    directory: Path | None = None  # None: default_directory()


def default_directory() -> Path:
    """``traces/`` beside the default spool (``~/.cache/otelprof/``), at the time of asking."""
    return Path(os.path.expanduser("~/.cache/otelprof/traces"))


def keep_from_env(environ: Mapping[str, str]) -> KeepSettings:
    return KeepSettings(
        count=value(environ, OTELPROF_KEEP_TRACES, _log),
        max_bytes=value(environ, OTELPROF_KEEP_TRACES_MAX_BYTES, _log),
        directory=value(environ, OTELPROF_TRACE_DIR, _log),
    )


def trace_name(run_id: str | None, rank: int | None, first_step: int | None, at_ns: int) -> str:
    """A name a person can tell apart: run id, rank, first recorded step, UTC time (ms)."""
    run = re.sub(r"[^A-Za-z0-9._-]", "-", run_id or "run")[:64].lstrip(".") or "run"
    step = "" if first_step is None else f"_step{first_step}"
    when = time.strftime("%Y%m%dT%H%M%S", time.gmtime(at_ns // 1_000_000_000))
    return f"{run}_rank{rank or 0}{step}_{when}.{at_ns // 1_000_000 % 1000:03d}Z{SUFFIX}"


class Refused(Exception):
    """The folder is not private (the message says why and what to do)."""


class TraceKeeper:
    """Keeps window traces in one folder. Used from the conversion thread only."""

    def __init__(self, settings: KeepSettings, not_kept: Callable[[], None] = lambda: None) -> None:
        self.settings = settings
        self.directory = settings.directory or default_directory()
        self.kept = 0
        self.not_kept: dict[str, int] = {}  # by reason
        self._count_not_kept = not_kept
        self._refused: str | None = None  # once refused, for good (logged once)
        self._warned: set[str] = set()
        self._swept = False
        self._seq = 0

    @property
    def enabled(self) -> bool:
        return self.settings.count > 0

    def keep(self, source: Path, name: str) -> Path | None:
        """``source`` (a saved Kineto JSON trace) gzip-compressed into the folder as ``name``,
        then the bounds applied; its final path, or None when it was not kept (counted)."""
        if not self.enabled:
            return None
        try:
            with self._folder() as fd:
                if not self._swept:
                    self._swept = True
                    _sweep(fd)
                size = self._write(fd, source, name)
                if size > self.settings.max_bytes:
                    _unlink(fd, name)
                    limit = self.settings.max_bytes
                    self._failed(TOO_LARGE, f"{size} bytes compressed, over OTELPROF_KEEP_TRACES_MAX_BYTES={limit}")
                    return None
                self._evict(fd, name)
        except Refused as exc:
            self._failed(UNSAFE, str(exc))
            return None
        except OSError as exc:  # full disk, read-only mount, not a folder, no permission, ...
            self._failed(UNWRITABLE, f"cannot write to {self.directory}: {exc.strerror or exc}")
            return None
        self.kept += 1
        return self.directory / name

    def keep_beside(self, kept: Path, suffix: str, data: bytes) -> Path | None:
        """``data`` written beside the kept trace ``kept`` as its companion with ``suffix``
        (temp file, rename); its path, or None when it was not written (counted, as a trace)."""

        def write(fd: int, name: str) -> bool:
            self._store(fd, name, lambda dst: dst.write(data))
            return True

        return self._beside(kept, suffix, write)

    def keep_file_beside(self, kept: Path, suffix: str, source: Path) -> Path | None:
        """The file ``source`` gzip-compressed beside the kept trace ``kept`` as its companion
        with ``suffix`` (an execution trace); its path, or None when not written (counted)."""

        def write(fd: int, name: str) -> bool:
            size = self._write(fd, source, name)
            if size > self.settings.max_bytes:
                _unlink(fd, name)
                limit = self.settings.max_bytes
                self._failed(TOO_LARGE, f"{size} bytes compressed, over OTELPROF_KEEP_TRACES_MAX_BYTES={limit}")
                return False
            self._evict(fd, kept.name)
            return True

        return self._beside(kept, suffix, write)

    def _beside(self, kept: Path, suffix: str, write: Callable[[int, str], bool]) -> Path | None:
        """A companion of ``kept`` written by ``write(folder fd, name)`` (False: not kept) while
        ``kept`` is still there; its path, or None (refusals and errors counted)."""
        name = companion(kept.name, suffix)
        try:
            with self._folder() as fd:
                try:
                    os.stat(kept.name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    return None  # evicted meanwhile (another rank's window)
                if not write(fd, name):
                    return None
        except Refused as exc:
            self._failed(UNSAFE, str(exc))
            return None
        except OSError as exc:
            self._failed(UNWRITABLE, f"cannot write to {self.directory}: {exc.strerror or exc}")
            return None
        return self.directory / name

    def _write(self, fd: int, source: Path, name: str) -> int:
        """Compresses ``source`` into ``name`` of the folder; the bytes kept."""

        def deflate_into(dst: BinaryIO) -> None:
            deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, 31)  # 31: a gzip member
            with open(source, "rb") as src:
                while chunk := src.read(CHUNK):
                    dst.write(deflate.compress(chunk))
            dst.write(deflate.flush())

        return self._store(fd, name, deflate_into)

    def _store(self, fd: int, name: str, fill: Callable[[BinaryIO], object]) -> int:
        """``fill`` writes a temp file of the folder, synced, then renamed ``name``; its size."""
        self._seq += 1
        temp = f".keep-{os.getpid()}-{self._seq}.tmp"
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as dst:
                fill(dst)
                dst.flush()
                os.fsync(dst.fileno())
                size = dst.tell()
            os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            _unlink(fd, temp)
            raise
        return size

    def _evict(self, fd: int, new: str) -> None:
        """The oldest kept traces go until this rank has ``count`` and the folder ``max_bytes``
        (``new`` stays). Only regular files of ours with kept traces' names are looked at."""
        found = _kept(fd)
        rank = _NAME.search(new)
        mine = [f for f in found if rank is not None and f[2] == rank.group(1)]
        gone = {f[1] for f in mine[: max(0, len(mine) - self.settings.count)] if f[1] != new}
        used = sum(f[3] for f in found if f[1] not in gone)
        for f in found:
            if used <= self.settings.max_bytes:
                break
            if f[1] != new and f[1] not in gone:
                gone.add(f[1])
                used -= f[3]
        for old in gone:
            _unlink(fd, old)  # another rank may have removed it first
            for suffix in COMPANIONS:
                _unlink(fd, companion(old, suffix))

    def folder(self) -> contextlib.AbstractContextManager[int]:
        """A context giving the folder's descriptor, checked private as the traces' (else
        ``Refused``): for files kept beside them (an out-of-memory step's memory snapshot)."""
        return self._folder()

    @contextlib.contextmanager
    def _folder(self) -> Iterator[int]:
        """A descriptor of the folder, made where missing, opened without following a symlink
        and checked private (else ``Refused``, for good)."""
        if self._refused is not None:
            raise Refused(self._refused)
        with private.opened(self.directory, _GUARD, self._refuse, _tighten) as fd:
            yield fd

    def _refuse(self, problem: str) -> NoReturn:
        self._refused = problem
        raise Refused(problem)

    def _failed(self, reason: str, why: str) -> None:
        self.not_kept[reason] = self.not_kept.get(reason, 0) + 1
        self._count_not_kept()
        if reason not in self._warned:
            self._warned.add(reason)
            _log.warning(
                "otelprof: a profiling window's trace was not kept (%s); the window is still converted and "
                "sent (further ones counted in otelprof_window_traces_not_kept_total)",
                why,
            )


def _kept(fd: int) -> list[tuple[str, str, str, int]]:
    """(time, name, rank, bytes) of the kept traces in the folder, oldest first."""
    out = []
    for name in os.listdir(fd):
        match = _NAME.search(name)
        if match is None:
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            out.append((match.group(2), name, match.group(1), st.st_size + _companion_bytes(fd, name)))
    return sorted(out)


def _companion_bytes(fd: int, name: str) -> int:
    total = 0
    for suffix in COMPANIONS:
        with contextlib.suppress(OSError):
            st = os.stat(companion(name, suffix), dir_fd=fd, follow_symlinks=False)
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def _sweep(fd: int) -> None:
    """Temp files of writers that died mid-write (their pid is in the name)."""
    for name in os.listdir(fd):
        match = _TEMP.match(name)
        if match is not None and not private.pid_alive(int(match.group(1))):
            _unlink(fd, name)


def _tighten(fd: int, mode: int) -> None:
    """Ours, readable by others: the traces hold the program's names (no files inside to chmod:
    each is written 0600)."""
    os.fchmod(fd, mode)


def _unlink(fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=fd)
