"""Kineto Chrome-trace JSON -> validated event records (mirrors native/src/reader.cpp)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...otlp._text import clean
from ...otlp.schema import (
    CATEGORY_KIND,
    DEVICE_KINDS,
    FLOW_CATEGORIES_CORRELATION,
    FLOW_CATEGORY_FWDBWD,
    MEMORY_EVENT_NAME,
    Kind,
)
from .._errors import TraceFormatError
from .jsonload import RawNumber, as_int64, loads, micros_to_ns, type_name

_I64_MAX = 2**63 - 1
_CANONICAL_INT = re.compile(r"-?(0|[1-9][0-9]*)\Z")

Ident = int | str


def norm_ident(value: Any, where: str) -> Ident:
    """pid/tid/flow id: int, or string (a canonical decimal string becomes an int)."""
    if value is None:
        return ""
    if isinstance(value, str) and not isinstance(value, RawNumber):
        if _CANONICAL_INT.match(value):
            number = int(value)
            if -_I64_MAX - 1 <= number <= _I64_MAX:
                return number
        return clean(value)
    integer = as_int64(value)
    if integer is None:
        raise TraceFormatError(f"{where}: expected an integer or string, got {type_name(value)} {value!r}")
    return integer


@dataclass(slots=True)
class Event:
    ordinal: int
    kind: Kind
    cat: str
    name: str
    pid: Ident
    tid: Ident
    start: int
    end: int
    args: dict[str, Any]

    @property
    def dur(self) -> int:
        return self.end - self.start

    @property
    def device(self) -> bool:
        return self.kind in DEVICE_KINDS


@dataclass(slots=True)
class Instant:
    ordinal: int
    pid: Ident
    tid: Ident
    ts: int
    args: dict[str, Any]


@dataclass(slots=True)
class Flow:
    ordinal: int
    fwdbwd: bool
    ph: str
    flow_id: Ident
    pid: Ident
    tid: Ident
    ts: int


@dataclass
class Trace:
    events: list[Event] = field(default_factory=list)
    memory: list[Instant] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    total: int = 0
    metadata_events: int = 0
    ignored_events: int = 0
    base_ns: int = 0
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    gpu_models: list[str] = field(default_factory=list)
    trace_id: str | None = None
    trace_name: str = ""
    host_name: str | None = None


def _opt_str(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str) and not isinstance(value, RawNumber):
        return clean(value)
    raise TraceFormatError(f"{where}: expected a string, got {type_name(value)}")


def _metadata(doc: dict[str, Any], trace: Trace, base_override: int | None) -> None:
    base = doc.get("baseTimeNanoseconds")
    if base_override is None and base is not None:
        number = as_int64(base)
        if number is None or number < 0:
            raise TraceFormatError(f"baseTimeNanoseconds: expected a non-negative integer, got {base!r}")
        trace.base_ns = number
    dist = doc.get("distributedInfo")
    if isinstance(dist, dict):
        rank, world = as_int64(dist.get("rank")), as_int64(dist.get("world_size"))
        trace.rank = rank if rank is not None and rank >= 0 else None
        trace.world_size = world if world is not None and world > 0 else None
        backend = dist.get("backend")
        if isinstance(backend, str) and not isinstance(backend, RawNumber) and backend:
            trace.backend = clean(backend)
    props = doc.get("deviceProperties")
    if isinstance(props, list):
        for prop in props:
            name = prop.get("name") if isinstance(prop, dict) else None
            if isinstance(name, str) and not isinstance(name, RawNumber):
                trace.gpu_models.append(clean(name))
    for key, attr in (("trace_id", "trace_id"), ("traceName", "trace_name"), ("host_name", "host_name")):
        value = doc.get(key)
        if isinstance(value, str) and not isinstance(value, RawNumber) and value:
            setattr(trace, attr, clean(value))


def read(data: bytes | bytearray, base_override: int | None = None) -> Trace:
    doc = loads(data)
    trace = Trace()
    if isinstance(doc, list):
        raw_events: Any = doc
    elif isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise TraceFormatError("not a Kineto trace: no 'traceEvents' array")
        raw_events = doc["traceEvents"]
        if not isinstance(raw_events, list):
            raise TraceFormatError(f"traceEvents: expected an array, got {type_name(raw_events)}")
        _metadata(doc, trace, base_override)
    else:
        raise TraceFormatError(f"not a Kineto trace: top level is {type_name(doc)}, not an object")
    if base_override is not None:
        trace.base_ns = base_override
    trace.total = len(raw_events)
    base = trace.base_ns
    for ordinal, raw in enumerate(raw_events):
        where = f"traceEvents[{ordinal}]"
        if not isinstance(raw, dict):
            raise TraceFormatError(f"{where}: expected an object, got {type_name(raw)}")
        ph = raw.get("ph")
        if not isinstance(ph, str) or isinstance(ph, RawNumber):
            raise TraceFormatError(f"{where}.ph: expected a string, got {type_name(ph)}")
        if ph == "M":
            trace.metadata_events += 1
            continue
        if ph not in ("X", "i", "I", "s", "f", "t"):
            trace.ignored_events += 1
            continue
        name = _opt_str(raw.get("name"), f"{where}.name")
        cat = _opt_str(raw.get("cat"), f"{where}.cat")
        pid = norm_ident(raw.get("pid"), f"{where}.pid")
        tid = norm_ident(raw.get("tid"), f"{where}.tid")
        if "ts" not in raw:
            raise TraceFormatError(f"{where}: missing 'ts'")
        start = base + micros_to_ns(raw["ts"], f"{where}.ts")
        if not 0 <= start <= _I64_MAX:
            raise TraceFormatError(f"{where}.ts: timestamp {start} ns is outside 0..2^63-1")
        args = raw.get("args")
        if args is None:
            args = {}
        elif not isinstance(args, dict):
            raise TraceFormatError(f"{where}.args: expected an object, got {type_name(args)}")
        if ph == "X":
            if "dur" not in raw:
                raise TraceFormatError(f"{where}: complete event without 'dur'")
            dur = micros_to_ns(raw["dur"], f"{where}.dur")
            if dur < 0:
                raise TraceFormatError(f"{where}.dur: negative duration")
            if start + dur > _I64_MAX:
                raise TraceFormatError(f"{where}.dur: end time is outside 0..2^63-1")
            kind = CATEGORY_KIND.get(cat, Kind.OTHER)
            trace.events.append(Event(ordinal, kind, cat, name, pid, tid, start, start + dur, args))
        elif ph in ("i", "I"):
            if name == MEMORY_EVENT_NAME:
                trace.memory.append(Instant(ordinal, pid, tid, start, args))
            else:
                trace.ignored_events += 1
        else:
            if cat == FLOW_CATEGORY_FWDBWD or cat in FLOW_CATEGORIES_CORRELATION:
                flow_id = norm_ident(raw.get("id"), f"{where}.id")
                trace.flows.append(Flow(ordinal, cat == FLOW_CATEGORY_FWDBWD, ph, flow_id, pid, tid, start))
            else:
                trace.ignored_events += 1
    return trace
