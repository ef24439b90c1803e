"""A window's memory by category, as torch's ``export_memory_timeline`` computes it.

torch's own ``MemoryProfile`` / ``MemoryProfileTimeline`` (``torch.profiler._memory_profiler``)
categorize every allocation of the window (parameter, optimizer state, input, temporary,
activation, gradient, autograd detail, unknown) and coalesce them into one row of bytes per
category for each microsecond at which something changed: the rows ``export_memory_timeline``
writes. This module reads those rows: per device, each category's peak and the total's peak
and its time; per recorded step, each category's peak within the step and the bytes held at
each of its phases' boundaries (the row in force then: the timeline's resolution is 1 us).
torch needs ``profile_memory``, ``record_shapes`` and ``with_stack`` for the categories.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...converter import LiveStep
from ...otlp.conventions import MEMORY_CATEGORIES

_log = logging.getLogger(__name__)

#: torch's categories in its timeline rows' order (``_CATEGORY_TO_INDEX``), lower-cased;
#: None (an allocation torch could not attribute) is ``unknown``.
CATEGORIES = MEMORY_CATEGORIES

Sizes = tuple[int, ...]  # bytes by CATEGORIES


@dataclass(frozen=True)
class Boundary:
    """A phase's start or end and what the device held then."""

    time_ns: int
    phase: str  # data, forward, backward, optimizer ("": a step without phase names)
    edge: str  # "start" or "end"
    sizes: Sizes


@dataclass(frozen=True)
class StepMemory:
    step: LiveStep
    start_ns: int
    end_ns: int
    peaks: Sizes  # each category's peak within the step
    total_peak: int  # the largest total within the step
    boundaries: tuple[Boundary, ...]


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # as torch names it: cpu, cuda:0
    peaks: Sizes  # each category's peak over the window
    total_peak: int  # the largest total of one row
    total_peak_ns: int  # when it was first reached (us resolution)
    steps: tuple[StepMemory, ...]


def rows(profile: Any) -> dict[str, tuple[list[int], list[list[int]]]]:
    """torch's coalesced timeline of each device in ``profile`` (a ``MemoryProfile``): (times in
    us, rows of bytes by category), exactly what ``export_memory_timeline`` writes for it."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    order = tuple("unknown" if c is None else c.name.lower() for c in _CATEGORY_TO_INDEX)
    if order != CATEGORIES:  # another torch: its rows mean something else
        raise ValueError(f"torch's memory categories changed: {order}")
    timeline = MemoryProfileTimeline(profile)
    devices = sorted({str(key.device) for _t, _action, (key, _version), _n in timeline.timeline})
    # torch's rows begin with an unused slot: category i is at i + 1
    return {
        d: (times, [row[1:] for row in sizes])
        for d in devices
        for times, sizes in [timeline._coalesce_timeline(d)]  # type: ignore[no-untyped-call]  # torch's own
    }


def summarize(times: list[int], sizes: list[list[int]], steps: Sequence[LiveStep], device: str) -> DeviceMemory:
    """One device's peaks and its steps' boundaries, from torch's coalesced rows."""
    n = len(CATEGORIES)
    peaks = tuple(max((row[i] for row in sizes), default=0) for i in range(n))
    totals = [sum(row) for row in sizes]
    best = max(range(len(totals)), key=lambda i: (totals[i], -i), default=None)
    total_peak = totals[best] if best is not None else 0
    peak_ns = times[best] * 1000 if best is not None else 0
    out = [s for s in (_step(times, sizes, step) for step in steps) if s is not None]
    return DeviceMemory(device, peaks, total_peak, peak_ns, tuple(out))


def _held(times: list[int], sizes: list[list[int]], t_ns: int) -> int:
    """Index of the row in force at ``t_ns`` (the last one at or before its microsecond; the
    first, the memory held before the window, for earlier times); -1 with no rows."""
    if not times:
        return -1
    return max(0, bisect.bisect_right(times, t_ns // 1000) - 1)


def _interval(step: LiveStep) -> tuple[int, int] | None:
    """The step's interval: its own, else (a device-timed step) its phases' CPU interval."""
    if step.end_ns > step.start_ns:
        return step.start_ns, step.end_ns
    if step.phases:
        return min(p[1] for p in step.phases), max(p[2] for p in step.phases)
    return None


def _step(times: list[int], sizes: list[list[int]], step: LiveStep) -> StepMemory | None:
    interval = _interval(step)
    if interval is None or not times:
        return None
    start, end = interval
    first = _held(times, sizes, start)
    last = max(first, bisect.bisect_right(times, end // 1000) - 1)
    inside = sizes[first : last + 1]
    peaks = tuple(max(row[i] for row in inside) for i in range(len(CATEGORIES)))
    names = step.phase_names if len(step.phase_names) == len(step.phases) else ("",) * len(step.phases)
    boundaries = []
    for name, (_span, p_start, p_end) in zip(names, step.phases, strict=True):
        for edge, t in (("start", p_start), ("end", p_end)):
            boundaries.append(Boundary(t, name, edge, tuple(sizes[_held(times, sizes, t)])))
    boundaries.sort(key=lambda b: b.time_ns)  # stable: a phase's end before the next one's start
    return StepMemory(step, start, end, peaks, max(sum(row) for row in inside), tuple(boundaries))


def window_memory(results: Any, steps: Sequence[LiveStep]) -> list[DeviceMemory]:
    """Every device's memory in a window from torch's results (``_ProfilerResult``, a
    ``_KinetoProfile``'s ``profiler.kineto_results``). Raises what torch raises."""
    from torch.profiler._memory_profiler import MemoryProfile

    return [summarize(times, sizes, steps, d) for d, (times, sizes) in rows(MemoryProfile(results)).items()]


_failed_logged = False


def safe_window_memory(results: Any, steps: Sequence[LiveStep], failed: Callable[[], None]) -> list[DeviceMemory]:
    """``window_memory``, never raising: a torch without the memory profiler, or any failure,
    is logged once per process and counted through ``failed``; the window goes on without it."""
    global _failed_logged
    try:
        return window_memory(results, steps)
    except Exception:
        failed()
        if not _failed_logged:
            _failed_logged = True
            _log.warning("otelprof: the window's memory timeline failed (counted; logged once)", exc_info=True)
        return []


def peaks_by_device(memory: Sequence[DeviceMemory]) -> dict[str, tuple[dict[str, int], int]]:
    """What the window metrics show: by device, each category's peak and the total at the peak."""
    return {d.device: (dict(zip(CATEGORIES, d.peaks, strict=True)), d.total_peak) for d in memory}
