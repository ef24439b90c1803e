"""Which files an import reads, what each one is, and which run and rank it belongs to.

Run ids decide trace ids (step N of run R is one trace on every rank), so files of one
distributed run must share one, and unrelated files must not. Without ``--run-id``:

- files in one folder whose names differ only in their numbers (``rank-0``/``rank-1``,
  ``worker0``/``worker1``, Composer's ``rank{rank}.{batch}``, timestamps) form a *set*;
- a set whose files all have different ranks is one run;
- where a rank repeats (several profiler windows per rank), files are grouped by their first
  ``ProfilerStep#N`` and each group whose ranks differ is one run; any file still sharing a
  rank with another is a run of its own, so unrelated files never share a step trace (span
  ids never collide anyway: the converter mixes each file's window id into them).

The run id reads ``<folder>/<stem>[@<first step>]#<digest>``: the folder's name (Composer's
``<run>/torch_traces``: the run's name), the file name without its suffix, rank/worker numbers,
numbers that differ between the run's files and stand-alone numbers (``node1_rank-2.17000….pt.trace.json``
-> ``node1``; no stem when nothing is left), the first step for a window grouped by it, and 8 hex
digits of SHA-256 over what used to be the id (folder, file name or name pattern, step group)
so runs with the same readable part stay apart. It depends on names only, never on where the
folder lies or on file times: the same files give the same ids.
"""

from __future__ import annotations

import logging
import os
import re
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..converter import TraceFormatError
from ..converter._load import load_bytes
from ..converter.execution_trace import is_execution_trace, read_head
from .pairing import pair

KINETO = "kineto"
NSYS = "nsys"
#: torch's execution trace (ExecutionTraceObserver): joined to the Kineto trace it pairs with
#: (pairing.py), imported with it; one with no partner is reported and counted, not imported.
EXECUTION_TRACE = "execution_trace"

SQLITE_MAGIC = b"SQLite format 3\x00"
#: Enough of a Kineto trace to see ``traceEvents`` and ``distributedInfo`` behind big metadata.
_HEAD_BYTES = 1024 * 1024
_HEAD_STEP = 64 * 1024
_KINETO_SUFFIXES = (".json", ".json.gz")
_TORCH_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")  # torch's tensorboard_trace_handler, Composer
_NSYS_SUFFIXES = (".sqlite", ".sqlite3")
#: nvprof's ``-o`` outputs (torch's docs use ``.prof``); taken from folders only when SQLite
_NVPROF_SUFFIXES = (".nvvp", ".nvprof", ".prof", ".sql")
_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
_NAME_RANK = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?([0-9]{1,9})(?![0-9])", re.IGNORECASE)
_DIST_INFO = re.compile(rb'"distributedInfo"\s*:\s*\{')
_DIST_RANK = re.compile(rb'"rank"\s*:\s*([0-9]{1,9})\b')
_STEP = re.compile(rb'"ProfilerStep#([0-9]{1,18})"')
_DIGITS = re.compile(r"[0-9]+")
_DIGITS_SPLIT = re.compile(r"([0-9]+)")
_ALL_SUFFIXES = sorted({*_TORCH_SUFFIXES, *_KINETO_SUFFIXES, *_NSYS_SUFFIXES, *_NVPROF_SUFFIXES}, key=len, reverse=True)
#: a rank or worker number with the separators before it (``_rank-3``, ``.worker0``)
_RANK_TOKEN = re.compile(r"[-_.]*(?:rank|worker)[-_]?(?:#|[0-9]+)(?![0-9])", re.IGNORECASE)
#: a number that differs between a run's files, with the separators before it
_VARYING = re.compile(r"[-_.]*#")
#: a number that is no part of a word (``_1``, ``.1700000000001``), with the separators before it
_NUMBER = re.compile(r"[-_.]*(?<![A-Za-z0-9])[0-9]+(?![A-Za-z0-9])")

_log = logging.getLogger(__name__)


class SourceError(ValueError):
    """A path given to import cannot be used (missing, an unexported report, no traces)."""


@dataclass(frozen=True)
class Source:
    """One file to import, with what its conversion needs."""

    path: Path
    kind: str  # KINETO or NSYS (any SQLite: Nsight Systems export or nvprof profile)
    run_id: str
    #: Rank for the converter: from the file name, only when the trace itself has none.
    rank: int | None
    size: int
    #: A Kineto trace's execution trace (pairing.py), joined into its op spans; None: none.
    execution_trace: Path | None = None
    #: A Kineto trace beside execution traces none of which pairs with it (reported, counted).
    execution_trace_missing: bool = False

    @property
    def key(self) -> str:
        """The ledger's name for the file."""
        return str(self.path.resolve())


@dataclass(frozen=True)
class _Found:
    path: Path
    kind: str
    trace_rank: int | None  # distributedInfo
    name_rank: int | None
    size: int

    @property
    def rank(self) -> int | None:
        return self.trace_rank if self.trace_rank is not None else self.name_rank


def find_sources(paths: Sequence[str | os.PathLike[str]], run_id: str | None = None) -> list[Source]:
    """Every trace under ``paths`` (files as given, folders searched recursively), in a stable
    order, each with its run id: ``run_id`` for all when given, else from the sets above."""
    found: dict[Path, _Found] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = list(_walk(path))
            if not files:
                raise SourceError(f"{path}: no traces found (*.json, *.json.gz, *.sqlite, nvprof *.nvvp)")
            for file in files:
                found.setdefault(file.resolve(), _inspect(file))
        elif path.exists():
            if path.name.endswith(_REPORT_SUFFIXES):
                raise SourceError(
                    f"{path}: an Nsight Systems report; export it first: nsys export --type sqlite {path}"
                )
            found.setdefault(path.resolve(), _inspect(path))
        else:
            raise SourceError(f"{path}: no such file or directory")
    items = sorted(found.values(), key=lambda f: str(f.path))
    traces = [f for f in items if f.kind != EXECUTION_TRACE]
    sources = [_source(f, run_id) for f in traces] if run_id is not None else _assign_runs(traces)
    ets = {f.path: f.name_rank for f in items if f.kind == EXECUTION_TRACE}
    pairs = pair({f.path: f.rank for f in traces if f.kind == KINETO}, ets)
    sources = [
        replace(s, execution_trace=pairs.partner.get(s.path), execution_trace_missing=s.path in pairs.missing)
        for s in sources
    ]
    return sources + [Source(p, EXECUTION_TRACE, "", ets[p], found[p.resolve()].size) for p in pairs.unpaired]


def _walk(root: Path) -> Iterable[Path]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = Path(folder) / name
            if _wanted(name, path):
                yield path


def _wanted(name: str, path: Path) -> bool:
    if name.endswith(_NSYS_SUFFIXES) or name.endswith(_TORCH_SUFFIXES):
        return True
    if name.endswith(_NVPROF_SUFFIXES):
        if _is_sqlite(path):
            return True
        _log.info("%s: skipped, not an nvprof SQLite profile", path)
        return False
    if not name.endswith(_KINETO_SUFFIXES):
        _log.info("%s: skipped, not a trace file (*.json, *.json.gz, *.sqlite)", path)
        return False
    if not _looks_like_kineto(path):
        if is_execution_trace(read_head(path)):
            return True
        _log.info("%s: skipped, a JSON file without traceEvents (not a Kineto trace)", path)
        return False
    return True


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def _head(path: Path, enough: Callable[[bytes], bool]) -> bytes:
    """The first bytes of a file (at most ``_HEAD_BYTES`` of it, gunzipped when it is gzip:
    at most ``_HEAD_BYTES`` of those too), read ``_HEAD_STEP`` bytes first, then twice as many
    each time, until ``enough(head)``: what a whole head would tell, a shorter one that tells it
    already does (a Kineto trace names ``traceEvents`` and ``distributedInfo`` in its first few
    KB), so a folder of big traces is not inflated a megabyte per file before its import starts.
    b"" when unreadable (the conversion reports the real error); the raw bytes when the gzip is
    corrupt."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(_HEAD_STEP)
            if raw[:2] != b"\x1f\x8b":
                while len(raw) < _HEAD_BYTES and not enough(raw) and (more := fh.read(len(raw))):
                    raw += more
                return raw[:_HEAD_BYTES]
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            head, pending, want = b"", raw, _HEAD_STEP
            while True:
                while len(head) < want and not inflater.eof:  # inflate up to `want` bytes
                    if not pending:
                        pending = fh.read(min(_HEAD_STEP, _HEAD_BYTES - len(raw))) if len(raw) < _HEAD_BYTES else b""
                        if not pending:
                            break
                        raw += pending
                    try:
                        head += inflater.decompress(pending, want - len(head))
                    except zlib.error:
                        return raw
                    pending = inflater.unconsumed_tail
                if len(head) < want or want >= _HEAD_BYTES or enough(head):  # all there is, or enough
                    return head
                want = min(2 * want, _HEAD_BYTES)
    except OSError:
        return b""


def _looks_like_kineto(path: Path) -> bool:
    """In a folder, a ``.json`` that is not a trace (a config, a metrics file) is skipped."""
    return _is_kineto_head(_head(path, lambda head: bool(head) and _is_kineto_head(head)))


def _is_kineto_head(head: bytes) -> bool:
    return not head or b'"traceEvents"' in head or head.lstrip()[:1] == b"[" or head[:2] == b"\x1f\x8b"


def _trace_rank(head: bytes, partial: bool = False) -> int | None:
    """distributedInfo's rank; in a ``partial`` head, only once all of its digits are there."""
    m = _DIST_INFO.search(head)
    r = _DIST_RANK.search(head, m.end(), m.end() + 4096) if m else None
    return int(r.group(1)) if r and (not partial or r.end() < len(head)) else None


def _inspect(path: Path) -> _Found:
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    name_rank = _rank_from_name(path.name)
    if magic == SQLITE_MAGIC or path.name.endswith(_NSYS_SUFFIXES):
        return _Found(path, NSYS, None, name_rank, size)
    head = _head(path, lambda head: _trace_rank(head, partial=True) is not None)
    if is_execution_trace(head):  # by its content, whatever its name
        return _Found(path, EXECUTION_TRACE, None, name_rank, size)
    return _Found(path, KINETO, _trace_rank(head), name_rank, size)


def _rank_from_name(name: str) -> int | None:
    m = _NAME_RANK.search(name)
    return int(m.group(1)) if m else None


def _source(found: _Found, run_id: str) -> Source:
    # distributedInfo wins; the name's rank only fills in where the trace has none
    rank = found.name_rank if found.trace_rank is None else None
    return Source(found.path, found.kind, run_id, rank, found.size)


def _folder_label(path: Path) -> str:
    parent = path.parent.resolve()
    if parent.name == "torch_traces" and parent.parent.name:  # Composer: {run_name}/torch_traces
        return f"{parent.parent.name}/{parent.name}"
    return parent.name or "/"


def _stem(names: Sequence[str]) -> str:
    """The readable part of a run's file names: suffixes, rank/worker numbers, numbers that
    differ between the files and stand-alone numbers dropped (``node1_rank-2.1700000000001.pt.trace.json``
    and ``node1_rank-3.…`` -> ``node1``; ``bench_1.json.gz`` -> ``bench``)."""
    stems = [_strip_suffix(n) for n in names]
    parts = [_DIGITS_SPLIT.split(s) for s in stems]
    first = parts[0]
    if all(len(p) == len(first) for p in parts):  # one pattern: digit runs at odd positions
        stem = "".join(
            "#" if k % 2 and any(p[k] != first[k] for p in parts) else piece for k, piece in enumerate(first)
        )
    else:
        stem = _DIGITS.sub("#", stems[0])
    stem = _RANK_TOKEN.sub("", stem)
    stem = _VARYING.sub("", stem)
    stem = _NUMBER.sub("", stem)
    return stem.strip("-_.")


def _strip_suffix(name: str) -> str:
    for suffix in _ALL_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _run_label(folder: str, names: Sequence[str], step: int | None, unique: str) -> str:
    """``<folder>/<stem>[@<first step>]#<8 hex digits>``: the readable part, then a digest of
    ``unique`` (folder, file name or name pattern, step group) that keeps runs apart whose
    readable parts are equal."""
    if folder.endswith("/torch_traces"):  # Composer: the run's name
        folder = folder[: -len("/torch_traces")]
    stem = _stem(names)
    label = f"{folder}/{stem}" if stem else folder
    if step is not None:
        label += f"@{step}"
    import hashlib  # here: `otelprof convert` reads this module for SQLITE_MAGIC alone

    return f"{label}#{hashlib.sha256(unique.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def _first_step(found: _Found) -> int | None:
    if found.kind != KINETO:
        return None
    try:
        data, _ = load_bytes(found.path)
    except TraceFormatError:
        return None  # the conversion reports it
    steps = [int(s) for s in _STEP.findall(data)]
    return min(steps) if steps else None


def _assign_runs(items: list[_Found]) -> list[Source]:
    sets: dict[tuple[str, str, str], list[_Found]] = defaultdict(list)
    for f in items:
        sets[(f.kind, str(f.path.parent.resolve()), _DIGITS.sub("#", f.path.name))].append(f)
    out: dict[Path, Source] = {}
    for (_kind, _folder, pattern), members in sets.items():
        folder = _folder_label(members[0].path)
        names = [f.path.name for f in members]
        if len(members) == 1:
            f = members[0]
            out[f.path] = _source(f, _run_label(folder, names, None, f"{folder}/{f.path.name}"))
            continue
        unique = f"{folder}/{pattern}"
        if _distinct_ranks(members):
            label = _run_label(folder, names, None, unique)
            for f in members:
                out[f.path] = _source(f, label)
            continue
        by_step: dict[int | None, list[_Found]] = defaultdict(list)
        for f in members:
            by_step[_first_step(f)].append(f)
        for step, group in by_step.items():
            shared = step is not None and _distinct_ranks(group)
            for f in group:
                if shared:
                    run = _run_label(folder, names, step, f"{unique}@{step}")
                else:
                    run = _run_label(folder, [f.path.name], None, f"{folder}/{f.path.name}")
                out[f.path] = _source(f, run)
    return [replace(out[f.path]) for f in items]


def _distinct_ranks(group: list[_Found]) -> bool:
    ranks = [f.rank for f in group]
    return len(set(ranks)) == len(ranks)


__all__ = ["EXECUTION_TRACE", "KINETO", "NSYS", "Source", "SourceError", "find_sources"]
