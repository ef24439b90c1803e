"""Folders of otelprof's own on disk (the spool, kept window traces): made 0700 where missing,
opened without following a symlink and refused, with the reason and what to do, when another
user owns them or others may write in them: whoever could would read the program's data or plant
files that otelprof sends (with the user's credentials) or trusts. Files inside are reached only
through the folder's descriptor (``dir_fd``), never by a path that could be swapped meanwhile."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: otelprof's own parent folder (the default spool and traces live in it): made 0700 too.
CACHE = "~/.cache/otelprof"


@dataclass(frozen=True)
class Guard:
    """How a folder's refusal reads: the setting naming another folder, and what a foreign owner
    or other writers could do there."""

    variable: str
    owner_could: str
    others_could: str

    def problem(self, directory: Path, st: os.stat_result) -> str | None:
        """Why a folder (its lstat/fstat) is not private; None: it is (root's own are root's)."""
        uid = os.geteuid()
        if st.st_uid != uid:
            return (
                f"{directory} belongs to uid {st.st_uid}, not to you (uid {uid}): its owner could "
                f"{self.owner_could}; set {self.variable} to a folder of your own"
            )
        if st.st_mode & 0o022:
            return (
                f"{directory} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): they could "
                f"{self.others_could}; `chmod 700 {directory}`, or set {self.variable} to a private folder"
            )
        return None

    def link(self, directory: Path) -> str:
        return f"{directory} is a symbolic link: set {self.variable} to a folder of your own"

    def lstat_problem(self, directory: Path) -> str | None:
        """Why ``directory`` may not be used, read without opening it (None: it may, or does not
        exist yet: it is made when first needed, and other errors show when it is used)."""
        try:
            st = os.lstat(directory)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return self.link(directory)
        return self.problem(directory, st) if stat.S_ISDIR(st.st_mode) else None


def create(directory: Path) -> None:
    """The folder 0700; its parents as the umask makes them, but otelprof's own CACHE 0700."""
    parent = directory.parent
    if parent == Path(os.path.expanduser(CACHE)):
        parent.parent.mkdir(parents=True, exist_ok=True)
        with suppress(FileExistsError):
            os.mkdir(parent, 0o700)
    else:
        parent.mkdir(parents=True, exist_ok=True)
    with suppress(FileExistsError):  # another process made it meanwhile: checked when opened
        os.mkdir(directory, 0o700)


@contextmanager
def opened(
    directory: Path,
    guard: Guard,
    refuse: Callable[[str], NoReturn],
    tighten: Callable[[int, int], None],
    make: bool = True,
) -> Iterator[int]:
    """A descriptor of ``directory`` (made where missing when ``make``, else FileNotFoundError),
    opened without following a symlink; a folder that is not private goes to ``refuse(why)``,
    which raises; one of ours readable by others to ``tighten(fd, mode without those bits)``.
    OSError when it cannot be opened."""
    try:
        fd = os.open(directory, DIR_FLAGS)
    except FileNotFoundError:
        if not make:
            raise
        create(directory)
        fd = os.open(directory, DIR_FLAGS)
    except OSError:
        if directory.is_symlink():  # ENOTDIR or ELOOP under O_NOFOLLOW
            refuse(guard.link(directory))
        raise
    try:
        st = os.fstat(fd)
        problem = guard.problem(directory, st)
        if problem is not None:
            refuse(problem)
        if st.st_mode & 0o077:
            tighten(fd, stat.S_IMODE(st.st_mode) & 0o700)
        yield fd
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` (a temp file's writer, named in it) still runs; this one's: True."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, someone else's
        return True
    return True
