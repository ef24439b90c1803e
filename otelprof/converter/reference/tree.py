"""The event tree: per-thread nesting, device work under its launch, owning steps, the
``key_averages`` tree and forward/backward pairs (mirrors the same passes in native/src/builder.cpp).

Events are addressed by their index in ``Trace.events``; -1 means "none".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...otlp.schema import AGGREGATE_KINDS, DEVICE_TIME_KINDS, FILTERED_NAMES, Kind
from .jsonload import as_int64
from .reader import Event, Flow, Instant

#: (time, 0 for an event / 1 for a probe, -end, ordinal, index or -1-probe)
Item = tuple[int, int, int, int, int]


def thread_key(pid: object, tid: object) -> tuple[Any, ...]:
    """Grouping key of a (pid, tid): ints and strings never collide."""
    return (type(pid) is str, pid, type(tid) is str, tid)


@dataclass
class Nesting:
    parent: list[int]
    children: list[list[int]]
    groups: dict[tuple[Any, ...], list[Item]]  # per thread, sorted
    probe_owner: list[int]  # innermost event running at each probe (memory events, then fwdbwd flows)


def nest(ev: list[Event], memory: list[Instant], fwd_flows: list[Flow]) -> Nesting:
    """CPU-side nesting per thread with torch's rule (``EventList._populate_cpu_children``):
    sorted by (start, -end), a candidate parent is popped when the event starts at or after
    its end or ends after it. Memory events and flows ride along as zero-length probes."""
    n = len(ev)
    parent = [-1] * n
    children: list[list[int]] = [[] for _ in range(n)]
    groups: dict[tuple[Any, ...], list[Item]] = {}
    for i, e in enumerate(ev):
        if not e.device:
            groups.setdefault(thread_key(e.pid, e.tid), []).append((e.start, 0, -e.end, e.ordinal, i))
    n_mem = len(memory)
    for k, mem in enumerate(memory):
        groups.setdefault(thread_key(mem.pid, mem.tid), []).append((mem.ts, 1, 0, mem.ordinal, -1 - k))
    for k, f in enumerate(fwd_flows):
        groups.setdefault(thread_key(f.pid, f.tid), []).append((f.ts, 1, 0, f.ordinal, -1 - n_mem - k))
    probe_owner = [-1] * (n_mem + len(fwd_flows))
    for items in groups.values():
        items.sort()
        stack: list[int] = []
        for item in items:
            i = item[4]
            if i >= 0:
                e = ev[i]
                while stack:
                    top = ev[stack[-1]]
                    if e.start >= top.end or e.end > top.end:
                        stack.pop()
                    else:
                        break
                if stack:
                    parent[i] = stack[-1]
                    children[stack[-1]].append(i)
                stack.append(i)
            else:
                t = item[0]
                while stack and t >= ev[stack[-1]].end:
                    stack.pop()
                probe_owner[-1 - i] = stack[-1] if stack else -1
    return Nesting(parent, children, groups, probe_owner)


def link_device_work(ev: list[Event], parent: list[int]) -> int:
    """Parents device events: kernels/memcpy/memset/sync under the runtime call with their
    correlation id, device annotations under the CPU annotation with their External id.
    Returns how many device events found no parent."""
    launcher_by_corr: dict[int, int] = {}
    annotation_by_ext: dict[int, int] = {}
    for i, e in enumerate(ev):
        if e.kind == Kind.RUNTIME:
            corr = as_int64(e.args.get("correlation"))
            if corr is not None and corr not in launcher_by_corr:
                launcher_by_corr[corr] = i
        elif e.kind == Kind.ANNOTATION:
            ext = as_int64(e.args.get("External id"))
            if ext is not None and ext not in annotation_by_ext:
                annotation_by_ext[ext] = i
    unlinked = 0
    for i, e in enumerate(ev):
        if e.device:
            if e.kind == Kind.GPU_ANNOTATION:
                ext_id = as_int64(e.args.get("External id"))
                p = annotation_by_ext.get(ext_id, -1) if ext_id is not None else -1
            else:
                corr_id = as_int64(e.args.get("correlation"))
                p = launcher_by_corr.get(corr_id, -1) if corr_id is not None else -1
            parent[i] = p
            unlinked += p < 0
    return unlinked


def owners(ev: list[Event], parent: list[int], step_num: dict[int, int], step_at: Callable[[int], int]) -> list[int]:
    """The step each event belongs to (a step is its own owner; -1 = the window): the
    owner of its parent, or for a top-level event the step containing its start."""
    unset = -2
    owner = [unset] * len(ev)
    for i in range(len(ev)):
        chain: list[int] = []
        j = i
        while owner[j] == unset:
            if j in step_num:
                owner[j] = j
                break
            p = parent[j]
            if p < 0:
                owner[j] = step_at(ev[j].start)
                break
            chain.append(j)
            j = p
        for c in chain:
            owner[c] = owner[j]
    return owner


def iteration_owners(ev: list[Event], parent: list[int], own_at: Callable[[int], int]) -> list[int]:
    """The iteration each event belongs to (-1 = the window), for a window without steps: the
    iteration of its parent, or, when its parent is in none (or it has no parent), ``own_at``."""
    unset = -2
    owner = [unset] * len(ev)
    chain: list[int] = []
    for i in range(len(ev)):
        chain.clear()
        j = i
        while owner[j] == unset:
            chain.append(j)
            j = parent[j]
            if j < 0:
                break
        for c in reversed(chain):
            p = parent[c]
            o = owner[p] if p >= 0 else -1
            owner[c] = o if o >= 0 else own_at(c)
    return owner


@dataclass
class SelfTimes:
    in_a: list[bool]  # part of the key_averages tree
    a_parent: list[int]
    a_children: list[int]
    child_dur: list[int]  # summed durations of key_averages children
    self_dev: list[int]  # device time attributed to the event itself


def self_times(ev: list[Event], parent: list[int]) -> SelfTimes:
    """The ``key_averages()`` tree: CPU-side operators, annotations, python functions and
    runtime calls minus torch's filtered names. A kernel's time is self device time of the
    nearest non-runtime ancestor of its launch."""
    n = len(ev)
    in_a = [not e.device and e.kind in AGGREGATE_KINDS and e.name not in FILTERED_NAMES for e in ev]
    a_parent = [-1] * n
    a_children = [0] * n
    child_dur = [0] * n
    for i in range(n):
        if in_a[i]:
            p = parent[i]
            while p >= 0 and not in_a[p]:
                p = parent[p]
            a_parent[i] = p
            if p >= 0:
                a_children[p] += 1
                child_dur[p] += ev[i].dur
    self_dev = [0] * n
    for i, e in enumerate(ev):
        if e.kind in DEVICE_TIME_KINDS and parent[i] >= 0:
            o = parent[i]
            while o >= 0 and not in_a[o]:
                o = parent[o]
            first_a = o
            while o >= 0 and ev[o].kind == Kind.RUNTIME:
                o = a_parent[o]
            if o < 0:
                o = first_a
            if o >= 0:
                self_dev[o] += e.dur
    return SelfTimes(in_a, a_parent, a_children, child_dur, self_dev)


def fwdbwd_pairs(ev: list[Event], fwd_flows: list[Flow], nesting: Nesting, n_mem: int) -> list[tuple[int, int]]:
    """(forward, backward) event pairs: from complete ``fwdbwd`` flows, or from sequence
    numbers when the trace has no such flows at all."""
    if fwd_flows:
        return _flow_pairs(ev, fwd_flows, nesting, n_mem)
    return _sequence_pairs(ev)


def _flow_pairs(ev: list[Event], fwd_flows: list[Flow], nesting: Nesting, n_mem: int) -> list[tuple[int, int]]:
    exact: dict[tuple[Any, ...], list[int]] = {}
    for items in nesting.groups.values():
        for item in items:
            if item[4] >= 0:
                e = ev[item[4]]
                exact.setdefault((*thread_key(e.pid, e.tid), e.start), []).append(item[4])

    def bind(k: int) -> int:
        """The op a flow end binds to: on its thread, starting at its time (preferring ops
        with a sequence number, the innermost), else the innermost op running then."""
        f = fwd_flows[k]
        cands = exact.get((*thread_key(f.pid, f.tid), f.ts), [])
        seq = [c for c in cands if "Sequence number" in ev[c].args]
        if seq or cands:
            return (seq or cands)[-1]
        return nesting.probe_owner[n_mem + k]

    starts: dict[Any, int] = {}
    ends: dict[Any, int] = {}
    for k, f in enumerate(fwd_flows):
        key = (type(f.flow_id) is str, f.flow_id)
        if f.ph == "s" and key not in starts:
            starts[key] = k
        elif f.ph == "f" and key not in ends:
            ends[key] = k
    pairs: list[tuple[int, int]] = []
    for key, k_end in sorted(ends.items(), key=lambda kv: fwd_flows[kv[1]].ordinal):
        if key in starts:
            fw, bw = bind(starts[key]), bind(k_end)
            if fw >= 0 and bw >= 0:
                pairs.append((fw, bw))
    return pairs


def _sequence_pairs(ev: list[Event]) -> list[tuple[int, int]]:
    """The first op with a non-zero ``Fwd thread id`` and sequence number S links to the last
    op with sequence number S and ``Fwd thread id`` 0 (or none) in the same process."""
    fwd_by_seq: dict[tuple[Any, ...], int] = {}
    bwd_by_seq: dict[tuple[Any, ...], int] = {}
    order = sorted(
        (i for i, e in enumerate(ev) if e.kind == Kind.CPU_OP),
        key=lambda i: (ev[i].start, -ev[i].end, ev[i].ordinal),
    )
    for i in order:
        e = ev[i]
        seq = as_int64(e.args.get("Sequence number"))
        if seq is None or seq < 0:
            continue
        seq_key = (type(e.pid) is str, e.pid, seq)
        fwd_tid = as_int64(e.args.get("Fwd thread id"))
        if fwd_tid:
            bwd_by_seq.setdefault(seq_key, i)
        elif "Fwd thread id" not in e.args or fwd_tid == 0:
            fwd_by_seq[seq_key] = i
    return [
        (fwd_by_seq[seq_key], bw)
        for seq_key, bw in sorted(bwd_by_seq.items(), key=lambda kv: ev[kv[1]].ordinal)
        if seq_key in fwd_by_seq
    ]
