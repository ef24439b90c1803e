"""Imported profiles as Kineto traces: each profiled process's rows are written as the
Chrome-trace JSON torch's profiler writes, then converted by the Kineto converter, so an
import gets exactly its span model (detail levels, span budget and chunks, roll-ups, hidden
counts, GPU lanes, fwd/bwd links, request splitting, ids, resource) with no second
implementation. docs/semantic-conventions.md ("Nsight Systems exports") has the mapping.

Times are written as microseconds with exactly three decimals from integer nanoseconds; the
converter reads the number's text, so they stay exact to the nanosecond.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..converter import ConvertOptions, ConvertResult
from ..converter._api import OpStats, convert_bytes
from ..otlp.resource import ResourceFacts
from ..otlp.spans import Attrs
from . import nvtx_markup

#: The process event's thread: a string, so it encloses no thread's events by time.
PROCESS_TID = '"process"'
#: Events joined per write into a process's buffer.
_FLUSH = 4096
_I64_MAX = 2**63 - 1

#: Importer counters (``ConvertResult.stats`` adds the converter's, summed over processes).
#: They reconcile: ``events_total = ignored_events + complete_events - processes`` (each
#: process adds one ``Trace`` event), and the converter's own rule accounts for every event.
IMPORT_STAT_KEYS = (
    "events_total", "ignored_events", "processes", "runtime_calls", "kernels", "memcpys", "memsets", "syncs",
    "nvtx_ranges", "nvtx_marks", "nvtx_ops",
)  # fmt: skip


def quote(text: str) -> str:
    """A JSON string (``text`` has no lone surrogates: ``otlp._text.clean`` first)."""
    return json.dumps(text, ensure_ascii=False)


def micros(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def event(cat: str, name: str, pid: object, tid: object, start: int, end: int, args: str = "") -> str:
    """One complete event: ``name`` quoted (:func:`quote`), ``pid``/``tid`` as JSON text or
    None (absent), ``args`` the members of its ``args`` object."""
    where = ("" if pid is None else f',"pid":{pid}') + ("" if tid is None else f',"tid":{tid}')
    return (
        f'{{"ph":"X","cat":"{cat}","name":{name}{where},"ts":{micros(start)},'
        f'"dur":{micros(end - start)},"args":{{{args}}}}}'
    )


def members(pairs: Iterable[tuple[str, object]]) -> str:
    """``"key":value`` members of the pairs whose value is not None (values rendered as JSON)."""
    return ",".join(f'"{k}":{_value(v)}' for k, v in pairs if v is not None)


def _value(v: object) -> str:
    if type(v) is int:  # the common case, without json.dumps's cost (millions of rows)
        return str(v)
    if type(v) is str:
        return quote(v)
    return json.dumps(v, separators=(",", ":"))


def valid_times(start: int, end: int) -> bool:
    return 0 <= start <= _I64_MAX and end <= _I64_MAX


class ProcessDoc:
    """One process's trace, written as its rows are read: the events joined into one buffer."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = _I64_MAX
        self.end = 0
        self._parts: list[str] = []
        self._buf = bytearray(b'{"traceEvents":[')

    def add(self, text: str, start: int, end: int) -> None:
        self._parts.append(text)
        if start < self.start:
            self.start = start
        if end > self.end:
            self.end = end
        if len(self._parts) >= _FLUSH:
            self._flush()

    def _flush(self) -> None:
        if self._parts:
            if self._buf[-1] != ord("["):
                self._buf += b","
            self._buf += ",".join(self._parts).encode()
            self._parts.clear()

    def finish(self, name: str, meta: str) -> bytearray:
        """The document: the events, then a ``Trace`` event named ``name`` over all of them (the
        window trace's root), then ``meta`` (top-level members, each with a leading comma)."""
        self.add(event("Trace", quote(name), self.pid, PROCESS_TID, self.start, self.end), self.start, self.end)
        self._flush()
        self._buf += b"]" + meta.encode() + b"}"
        return self._buf


def file_meta(host: str | None, gpus: list[str]) -> str:
    """The top-level members a Kineto trace carries: ``deviceProperties`` (GPU models) and
    ``host_name``."""
    out = ',"deviceProperties":[' + ",".join(f'{{"id":{i},"name":{quote(g)}}}' for i, g in enumerate(gpus)) + "]"
    return out + (f',"host_name":{quote(host)}' if host else "")


@dataclass
class Range:
    """An NVTX range of a process, as read (in reading order: the events' order)."""

    start: int
    end: int
    tid: int
    text: str


def add_ranges(doc: ProcessDoc, ranges: list[Range], stats: dict[str, int]) -> None:
    """NVTX ranges as events: ``user_annotation``, or ``cpu_op`` where the text carries
    ``emit_nvtx`` markup, with ``Sequence number`` and ``Input Dims``; a backward op (its
    parent range is the engine's ``evaluate_function`` range, or torch <= 1.1's ``stashed``)
    also gets ``Fwd thread id``: the thread of the last forward op with its sequence number
    that started before it (its own when there is none), so the converter links the two."""
    ops = [nvtx_markup.parse(r.text) if r.text else None for r in ranges]
    names = [op.name if op is not None else (r.text or "nvtx range") for r, op in zip(ranges, ops, strict=True)]
    parent = [-1] * len(ranges)
    by_thread: dict[int, list[int]] = {}
    for k, r in enumerate(ranges):
        by_thread.setdefault(r.tid, []).append(k)
    for items in by_thread.values():  # torch's nesting rule, as the converter's
        stack: list[int] = []
        for k in sorted(items, key=lambda k: (ranges[k].start, -ranges[k].end, k)):
            r = ranges[k]
            while stack and (r.start >= ranges[stack[-1]].end or r.end > ranges[stack[-1]].end):
                stack.pop()
            parent[k] = stack[-1] if stack else -1
            stack.append(k)
    fwd_tid: dict[int, int] = {}
    last_forward: dict[int, int] = {}
    for k in sorted(range(len(ranges)), key=lambda k: (ranges[k].start, -ranges[k].end, k)):
        op = ops[k]
        if op is None or op.sequence_number is None:
            continue
        if nvtx_markup.is_backward(op, names[parent[k]] if parent[k] >= 0 else None):
            fwd_tid[k] = last_forward.get(op.sequence_number, ranges[k].tid)
        else:
            last_forward[op.sequence_number] = ranges[k].tid
    for k, r in enumerate(ranges):
        op = ops[k]
        cat, args = "user_annotation", ""
        if op is not None:
            cat, args = "cpu_op", members(op.kineto_args(fwd_tid.get(k)))
            stats["nvtx_ops"] += 1
        doc.add(event(cat, quote(names[k]), doc.pid, r.tid, r.start, r.end, args), r.start, r.end)


@dataclass(frozen=True)
class ProcessOptions(ConvertOptions):
    """``ConvertOptions`` for one imported process: its resource names the process (pid,
    executable) and the file's format, which a Kineto trace cannot say."""

    process: ResourceFacts = field(default_factory=ResourceFacts)

    def resource(self, facts: ResourceFacts) -> tuple[Attrs, int]:
        p = self.process
        facts = dataclasses.replace(facts, pid=p.pid, executable=p.executable, source_format=p.source_format)
        return super().resource(facts)


def convert_processes(
    docs: dict[int, ProcessDoc],
    meta: str,
    opts: ConvertOptions,
    process: Callable[[int], tuple[str, ResourceFacts]],
    counts: dict[str, int],
    engine: str = "auto",
) -> ConvertResult:
    """Each process's document converted (in pid order) with ``opts`` (times are absolute:
    no ``base_time_ns``); ``process(pid)`` gives its root's name and resource facts. Stats:
    the converter's, summed, with ``counts`` (IMPORT_STAT_KEYS) over them. ``window_id``: the
    process's, for a file of one process."""
    base = {f.name: getattr(opts, f.name) for f in dataclasses.fields(ConvertOptions)}
    base["base_time_ns"] = None
    requests: list[bytes] = []
    stats: dict[str, int] = {}
    ops: dict[tuple[str, str, str], OpStats] = {}
    engine_name = engine
    window_ids: list[str] = []
    for pid in sorted(docs):
        name, facts = process(pid)
        data = docs.pop(pid).finish(name, meta)
        result = convert_bytes(data, ProcessOptions(**base, process=facts), engine)
        del data  # each document freed once converted
        requests.extend(result.requests)
        for key, value in result.stats.items():
            stats[key] = stats.get(key, 0) + value
        for row in result.ops:
            ops[(row.name, row.kind, row.input_shapes)] = _merged(ops.get((row.name, row.kind, row.input_shapes)), row)
        engine_name = result.engine  # the same for every process
        window_ids.append(result.window_id)
    stats.update(counts)  # rows read and ignored, where the converter counts its documents' events
    stats["requests"] = len(requests)
    return ConvertResult(
        requests, list(ops.values()), stats, engine_name, window_ids[0] if len(window_ids) == 1 else ""
    )


def _merged(a: OpStats | None, b: OpStats) -> OpStats:
    if a is None:
        return b
    return dataclasses.replace(
        a,
        calls=a.calls + b.calls,
        cpu_total_ns=a.cpu_total_ns + b.cpu_total_ns,
        self_cpu_ns=a.self_cpu_ns + b.self_cpu_ns,
        device_total_ns=a.device_total_ns + b.device_total_ns,
        self_device_ns=a.self_device_ns + b.self_device_ns,
    )


__all__ = [
    "IMPORT_STAT_KEYS",
    "ProcessDoc",
    "ProcessOptions",
    "Range",
    "add_ranges",
    "convert_processes",
    "event",
    "file_meta",
    "members",
    "quote",
    "valid_times",
]
