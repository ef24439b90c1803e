"""A window's Kineto trace as stack samples: each operator's (and Python function's) CPU self
time, and each kernel's, memcpy's and memset's device time, on the stack that ran or launched it.

The tree is the converter's own: the reference engine's ``key_averages`` tree
(``converter/reference/tree.py``, which the native core is tested equal to) over the events as
the reference reader reads them (``events``, a faster read of the same, tested equal), so the
samples sum to the window's ``ConvertResult.ops`` self times exactly: CPU to the op and
annotation rows' ``self_cpu_ns``, device to the device rows' ``self_device_ns``. A negative self
time (children overlapping in time) is taken from the frames below (``non_negative``); device
work whose launch is not in the trace sits under ``UNATTRIBUTED``. The native core's tree is
not reachable from Python: this pass re-reads the saved JSON on the conversion thread
(benchmarks/profiles.py measures it). ``samples_from_file`` runs its native twin
(``_native.stack_samples``: the same reader and tree in C++, with the GIL released) when the
module loads; ``samples`` is the reference it is tested equal to
(tests/capture/test_stacks_native.py).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from ..._native_module import native as _native
from ...converter.reference import tree
from ...converter.reference.jsonload import RawNumber, as_int64, micros_to_ns
from ...converter.reference.reader import Event, norm_ident
from ...otlp._text import clean
from ...otlp.schema import CATEGORY_KIND, DEVICE_TIME_KINDS, Kind

#: The root frame of device work whose launch the trace does not have.
UNATTRIBUTED = "[device work without a launch]"
# ASCII digits, at most 18 (an int64, as the builder's step numbers): what the native twin reads
_PYTHON_FRAME = re.compile(r"(?P<file>.*)\((?P<line>[0-9]{1,18})\): (?P<func>.*)\Z", re.S)
_STEP = re.compile(r"ProfilerStep#([0-9]{1,18})\Z")
#: "<built-in method mean of Tensor object at 0x7f...>": the address differs by call and run
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>\Z)")


class Frame(NamedTuple):
    """One stack frame: a Python function (file and line from torch's ``path(line): name``),
    else an operator, annotation, runtime call or device kernel (its name alone)."""

    name: str
    file: str = ""
    line: int = 0

    @property
    def label(self) -> str:
        """How flame graphs show it: torch's own event name."""
        return f"{self.file}({self.line}): {self.name}" if self.file else self.name


@dataclass(frozen=True)
class Samples:
    """Values in nanoseconds by (stack, step): stacks are root first; step is the
    ``ProfilerStep#N`` number the work belongs to (None: outside every step)."""

    cpu: dict[tuple[tuple[Frame, ...], int | None], int]
    device: dict[tuple[tuple[Frame, ...], int | None], int]
    start_ns: int
    end_ns: int

    @property
    def cpu_total_ns(self) -> int:
        return sum(self.cpu.values())

    @property
    def device_total_ns(self) -> int:
        return sum(self.device.values())


def frame(e: Event) -> Frame:
    if e.kind == Kind.PYTHON:
        m = _PYTHON_FRAME.match(e.name)
        if m is not None:
            return Frame(m.group("func"), m.group("file"), int(m.group("line")))
        return Frame(_ADDRESS.sub("", e.name))
    if _STEP.match(e.name):
        return Frame("ProfilerStep*")  # as key_averages names it: one flame for every step
    return Frame(e.name)


def samples_from_file(path: str, base_time_ns: int | None = None) -> Samples:
    with open(path, "rb") as f:
        data = f.read()
    return native_samples(data, base_time_ns) if _native is not None else samples(data, base_time_ns)


def native_samples(data: bytes | bytearray, base_time_ns: int | None = None) -> Samples:
    """``samples`` by the native core, with the GIL released but to make the frames, stacks
    and sums into Python objects (once per distinct one, not per event). It reads the trace as
    the converter does: what the converter rejects raises ``_native.TraceError``."""
    assert _native is not None, "otelprof._native is not built"
    out = _native.stack_samples(data, base_time_ns)
    frames = [Frame(*f) for f in out.frames]
    by_id: list[tuple[Frame, ...]] = []
    for parent, f in out.stacks:  # parents come first
        by_id.append((*by_id[parent], frames[f]) if parent >= 0 else (frames[f],))
    cpu = {(by_id[k], step): ns for k, step, ns in out.cpu}
    device = {(by_id[k], step): ns for k, step, ns in out.device}
    return Samples(cpu, device, out.start_ns, out.end_ns)


def samples(data: bytes | bytearray, base_time_ns: int | None = None) -> Samples:
    """The stack samples of a Kineto trace (JSON bytes)."""
    ev = events(data, base_time_ns)
    parent = tree.nest(ev, [], []).parent  # memory events and flows only place probes
    tree.link_device_work(ev, parent)
    times = tree.self_times(ev, parent)
    step_of = _step_owner(ev, times.a_parent, times.in_a)
    # stacks are interned: each event's is built once from its parent's, and the sums are
    # keyed by small integers (hashing a deep tuple per event was a fifth of the pass)
    interned: dict[tuple[Frame, ...], int] = {}
    by_id: list[tuple[Frame, ...]] = []
    names: dict[tuple[Kind, str], Frame] = {}
    sid: dict[int, int] = {}

    def intern(frames: tuple[Frame, ...]) -> int:
        k = interned.get(frames)
        if k is None:
            k = interned[frames] = len(by_id)
            by_id.append(frames)
        return k

    def stack(i: int) -> int:
        """The interned stack of ``i``: its key_averages ancestors and itself, root first."""
        chain: list[int] = []
        j = i
        while j >= 0 and j not in sid:
            chain.append(j)
            j = times.a_parent[j]
        above = by_id[sid[j]] if j >= 0 else ()
        for k in reversed(chain):
            e = ev[k]
            f = names.get((e.kind, e.name))
            if f is None:
                f = names[(e.kind, e.name)] = frame(e)
            above = (*above, f)
            sid[k] = intern(above)
        return sid[i]

    self_cpu = non_negative(ev, times)
    cpu: dict[tuple[int, int | None], int] = {}
    device: dict[tuple[int, int | None], int] = {}
    for i, e in enumerate(ev):
        if times.in_a[i]:
            key = (stack(i), step_of(i))
            cpu[key] = cpu.get(key, 0) + self_cpu[i]
        elif e.kind in DEVICE_TIME_KINDS:
            owner = _device_owner(ev, parent, times, i)
            above = by_id[stack(owner)] if owner >= 0 else (Frame(UNATTRIBUTED),)
            key = (intern((*above, Frame(e.name))), step_of(owner) if owner >= 0 else None)
            device[key] = device.get(key, 0) + e.dur
    start = min((e.start for e in ev), default=0)
    end = max((e.end for e in ev), default=0)
    cpu_out = {(by_id[k], step): ns for (k, step), ns in cpu.items()}
    device_out = {(by_id[k], step): ns for (k, step), ns in device.items()}
    return Samples(cpu_out, device_out, start, end)


def events(data: bytes | bytearray, base_time_ns: int | None = None) -> list[Event]:
    """The trace's complete events as the reference reader makes them (ordinals, kinds, names,
    ids, nanosecond times, args), the rest of it left unread: the trace is torch's own, already
    converted, so the reader's checks (nesting depth, each field's type) are not repeated here;
    they were half of this pass's time (tests/capture/test_profiles.py checks both agree)."""
    doc = json.loads(data, parse_float=RawNumber)
    raw = doc if isinstance(doc, list) else doc["traceEvents"]
    base = 0
    if base_time_ns is not None:
        base = base_time_ns
    elif isinstance(doc, dict):
        base = as_int64(doc.get("baseTimeNanoseconds")) or 0
    out = []
    for ordinal, r in enumerate(raw):
        if r.get("ph") != "X":
            continue
        cat, name = r.get("cat") or "", r.get("name") or ""
        start = base + to_ns(r["ts"])
        end = start + to_ns(r["dur"])
        pid, tid = norm_ident(r.get("pid"), "pid"), norm_ident(r.get("tid"), "tid")
        kind = CATEGORY_KIND.get(cat, Kind.OTHER)
        out.append(Event(ordinal, kind, clean(cat), clean(name), pid, tid, start, end, r.get("args") or {}))
    return out


def to_ns(value: object) -> int:
    """``micros_to_ns`` (exact, half away from zero) without its ``Decimal`` for the plain
    non-negative decimals torch writes (``1764243759068123.456``): a fifth of the pass's time
    went there. Anything else goes to ``micros_to_ns`` itself."""
    if isinstance(value, RawNumber):
        whole, _, frac = value.partition(".")
        if whole.isdigit() and len(whole) <= 16 and frac.isdigit():
            ns = int(whole) * 1000 + int((frac + "00")[:3])
            return ns + 1 if len(frac) > 3 and frac[3] >= "5" else ns
    elif type(value) is int and 0 <= value < 10**16:
        return value * 1000
    return micros_to_ns(value, "time")


def non_negative(ev: list[Event], times: tree.SelfTimes) -> list[int]:
    """key_averages' self CPU times (``dur - child_dur``), with every negative one (children that
    overlap each other in time: torch's ProfilerStep ranges cross Python frames) made 0 and taken
    from the events below it, latest first: flame graph viewers refuse negative weights, and
    each event's subtree, so the window, keeps its total exactly."""
    n = len(ev)
    own = [ev[i].dur - times.child_dur[i] if times.in_a[i] else 0 for i in range(n)]
    if all(v >= 0 for v in own):
        return own
    children: list[list[int]] = [[] for _ in range(n)]
    depth = [0] * n
    order = sorted((i for i in range(n) if times.in_a[i]), key=lambda i: (ev[i].start, -ev[i].end, ev[i].ordinal))
    for i in order:  # parents before children: torch's nesting order
        p = times.a_parent[i]
        if p >= 0:
            children[p].append(i)
            depth[i] = depth[p] + 1
    for i in sorted((i for i in range(n) if own[i] < 0), key=lambda i: -depth[i]):  # deepest first
        owed, own[i] = -own[i], 0
        todo = list(children[i])  # a stack: the latest child is taken from first
        while owed and todo:
            j = todo.pop()
            take = min(owed, max(own[j], 0))
            own[j] -= take
            owed -= take
            todo.extend(children[j])
        # the subtree below holds at least ``owed`` (its sum is dur + owed, every value >= 0 there)
        assert owed == 0, "a subtree's self times sum to its duration"
    return own


def _device_owner(ev: list[Event], parent: list[int], times: tree.SelfTimes, i: int) -> int:
    """The event whose self device time ``i`` is (tree.self_times' rule), or -1."""
    o = parent[i]
    while o >= 0 and not times.in_a[o]:
        o = parent[o]
    first = o
    while o >= 0 and ev[o].kind == Kind.RUNTIME:
        o = times.a_parent[o]
    return first if o < 0 else o


def _step_owner(ev: list[Event], a_parent: list[int], in_a: list[bool]) -> _StepOf:
    """Each event's step: its ``ProfilerStep#N`` ancestor, else the step running on any thread
    when its outermost ancestor began (the autograd engine's thread has no marker above its
    operators)."""
    marks = sorted(
        (e.start, e.end, int(m.group(1))) for e in ev if not e.device and (m := _STEP.match(e.name)) is not None
    )
    return _StepOf(ev, a_parent, in_a, marks)


class _StepOf:
    def __init__(self, ev: list[Event], a_parent: list[int], in_a: list[bool], marks: list[tuple[int, int, int]]):
        self._ev, self._a_parent, self._in_a = ev, a_parent, in_a
        self._marks = marks
        self._starts = [m[0] for m in marks]
        self._memo: dict[int, int | None] = {}

    def __call__(self, i: int) -> int | None:
        found = self._memo.get(i, -1)
        if found != -1:
            return found
        chain = []
        j, step = i, None
        while j >= 0:
            if j in self._memo:
                step = self._memo[j]
                break
            chain.append(j)
            m = _STEP.match(self._ev[j].name) if self._in_a[j] else None
            if m is not None:
                step = int(m.group(1))
                break
            j = self._a_parent[j]
        else:  # no marker above: the step running when the outermost event began
            step = self._at(self._ev[chain[-1]].start)
        for k in chain:
            self._memo[k] = step
        return step

    def _at(self, t: int) -> int | None:
        k = bisect_right(self._starts, t) - 1
        return self._marks[k][2] if k >= 0 and t < self._marks[k][1] else None


def collapsed(values: Iterable[tuple[tuple[tuple[Frame, ...], int | None], int]]) -> str:
    """Brendan Gregg's folded format (``frame;frame;frame value``, root first), steps merged,
    one line per stack in sorted order; ``;`` and line breaks in names become spaces."""
    # a stack recurs once per step, as one shared tuple: each is folded once, found by object
    # (no deep hash), each frame once (tests/capture/test_profiles_encode.py: as before, byte for byte)
    lines: dict[int, str] = {}
    held = []  # keeps each id in ``lines`` the tuple's own
    folded: dict[Frame, str] = {}
    merged: dict[str, int] = {}
    for (stack, _step), ns in values:
        line = lines.get(id(stack))
        if line is None:
            held.append(stack)
            parts = []
            for f in stack:
                text = folded.get(f)
                if text is None:
                    text = folded[f] = _fold(f.label)
                parts.append(text)
            line = lines[id(stack)] = ";".join(parts)
        merged[line] = merged.get(line, 0) + ns
    return "".join([f"{line} {ns}\n" for line, ns in sorted(merged.items()) if ns])


def _fold(label: str) -> str:
    return _FOLD.sub(" ", label) or "?"


_FOLD = re.compile(r"[;\r\n]")
