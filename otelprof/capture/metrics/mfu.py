"""FLOPs per step, achieved FLOP/s and model FLOPs utilisation (MFU), from windows recorded
with ``with_flops``.

torch 2.13 counts FLOPs per operator (``KinetoEvent.flops()``: mm, addmm, bmm, baddbmm, conv2d,
elementwise mul and add, from the recorded input shapes) but does not write them into the Kineto
JSON, so they are read from torch's results on the conversion thread (``window_flops``), once
per window. Backward nodes (``AddmmBackward0`` ...) carry none: the ``aten::mm`` calls they make
do, so a step's sum is forward and backward as autograd ran them.

Between windows the last window's FLOPs per step is carried forward: the session stores each
training step's seconds (``Mfu.step_s``, an attribute store per step) and the achieved FLOP/s and
MFU are divided out at scrape or export time, under ``source="estimated"``; the window's own
figures (its recorded steps, slowed by the profiler) are ``source="window"``.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .peak_flops import DTYPES, peak_flops

_log = logging.getLogger(__name__)
_STEP = "ProfilerStep#"


@dataclass(frozen=True)
class WindowFlops:
    steps: int  # the window's whole recorded steps
    flops: int  # their FLOPs, all steps together
    wall_s: float  # their wall time, all steps together
    dtype: str | None  # the peak table's dtype that most FLOPs ran in
    device: str  # "cpu", or the index of the CUDA device that ran most kernel time
    device_name: str  # torch.cuda.get_device_name(), "" on CPU

    @property
    def flops_per_step(self) -> float:
        return self.flops / self.steps


def window_flops(results: Any, unfinished: int | None = None) -> WindowFlops | None:
    """The FLOPs of a window's ``ProfilerStep#N`` steps (but ``unfinished``'s), from torch's
    results (``_ProfilerResult``); None without a step or a counted FLOP. Each operator goes
    to the step whose range holds its start, whatever its thread (backward runs on autograd's)."""
    import torch
    from torch.autograd import DeviceType

    steps: list[tuple[int, int]] = []  # (start ns, end ns)
    counted: list[tuple[int, int, list[str]]] = []  # (start ns, flops, input types)
    kernel_ns: dict[int, int] = {}
    for e in results.events():
        flops = e.flops()
        if flops:
            counted.append((e.start_ns(), flops, e.dtypes()))
            continue
        if e.device_type() == DeviceType.CUDA:
            kernel_ns[e.device_index()] = kernel_ns.get(e.device_index(), 0) + e.duration_ns()
            continue
        name = e.name()
        if name.startswith(_STEP) and name[len(_STEP) :] != str(unfinished):
            steps.append((e.start_ns(), e.end_ns()))
    steps.sort()
    starts = [s for s, _ in steps]
    total = 0
    by_dtype: dict[str, int] = {}
    for start, flops, types in counted:
        i = bisect.bisect_right(starts, start) - 1
        if i < 0 or start >= steps[i][1]:
            continue  # outside every whole step (the unfinished one)
        total += flops
        dtype = next((DTYPES[t] for t in types if t in DTYPES), None)
        if dtype is not None:
            by_dtype[dtype] = by_dtype.get(dtype, 0) + flops
    if not steps or not total:
        return None
    dtype = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None
    device, name = "cpu", ""
    if kernel_ns:
        index = max(kernel_ns, key=kernel_ns.__getitem__)
        device, name = str(index), torch.cuda.get_device_name(index)
        if dtype == "fp32" and torch.backends.cuda.matmul.allow_tf32:
            dtype = "tf32"  # FP32 matmuls run on TF32 tensor cores
    wall_s = sum(end - start for start, end in steps) / 1e9
    return WindowFlops(len(steps), total, wall_s, dtype, device, name)


class Mfu(Collector):
    """``otelprof_step_flops``, ``otelprof_achieved_flops_per_second`` and
    ``otelprof_mfu_ratio`` (with a peak: the table's, or ``peak_override``), labelled with the
    run's labels, ``device`` and ``source``; nothing before the first window with FLOPs."""

    def __init__(self, labels: Mapping[str, str], peak_override: float | None = None) -> None:
        self._names = [*labels, "device", "source"]
        self._values = list(labels.values())
        self._override = peak_override
        self._lock = threading.Lock()
        self._last: WindowFlops | None = None
        self._peak: float | None = None
        self._unknown: set[tuple[str, str | None]] = set()  # (device, dtype) without a peak: logged once
        #: the last training step's seconds: the session stores it at each step (no lock: one
        #: float attribute, read whole)
        self.step_s = 0.0

    def window(self, flops: WindowFlops) -> None:
        """A window's FLOPs (conversion thread)."""
        peak = self._override
        if peak is None and flops.device != "cpu":
            peak = peak_flops(flops.device_name, flops.dtype)
            if peak is None and (flops.device_name, flops.dtype) not in self._unknown:
                self._unknown.add((flops.device_name, flops.dtype))
                _log.warning(
                    "otelprof: no peak FLOP/s known for %r at %s; set OTELPROF_PEAK_FLOPS for MFU",
                    flops.device_name,
                    flops.dtype,
                )
        with self._lock:
            self._last, self._peak = flops, peak

    @property
    def last(self) -> WindowFlops | None:
        return self._last

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            last, peak = self._last, self._peak
        step_s = self.step_s
        if last is None:
            return
        per_step = last.flops_per_step
        window = [*self._values, last.device, "window"]
        estimated = [*self._values, last.device, "estimated"]
        rates = [(window, last.flops / last.wall_s if last.wall_s > 0 else None)]
        rates.append((estimated, per_step / step_s if step_s > 0 else None))
        family = GaugeMetricFamily(
            "otelprof_step_flops",
            "FLOPs per training step (forward and backward, as torch's with_flops counts them) in the last window.",
            labels=self._names,
        )
        family.add_metric(window, per_step)
        yield family
        family = GaugeMetricFamily(
            "otelprof_achieved_flops_per_second",
            "FLOPs per step over step time: the last window's recorded steps (source=window), or the "
            "last window's FLOPs per step over the last step's time (source=estimated).",
            labels=self._names,
        )
        for labels, rate in rates:
            if rate is not None:
                family.add_metric(labels, rate)
        yield family
        if peak is None:
            return
        family = GaugeMetricFamily(
            "otelprof_mfu_ratio",
            "Model FLOPs utilisation: achieved FLOP/s over the device's dense peak for the window's matmul "
            "dtype (or OTELPROF_PEAK_FLOPS), by source as otelprof_achieved_flops_per_second.",
            labels=self._names,
        )
        for labels, rate in rates:
            if rate is not None:
                family.add_metric(labels, rate / peak)
        yield family
