"""Per-step memory peaks, always on: CUDA's caching allocator (allocated, reserved) and the
process's resident high-water mark.

Both are read at a step's end and reset for the next step: CUDA's peaks through
``torch._C._cuda_resetPeakMemoryStats``, the kernel's resident high-water mark (VmHWM) by
writing "5" to ``/proc/self/clear_refs``. otelprof is a guest: the process's own readings must
read as without it, so the lifetime maxima otelprof's resets took away are kept and the entry
points every Python caller goes through are wrapped to add them back
(``torch._C._cuda_memoryStats`` / ``_cuda_resetPeakMemoryStats``, ``resource.getrusage``).
The shims' arithmetic is in pure functions over dicts (``fold_peaks``, ``with_kept``).

On the native route the step sink reads the resident peak itself (``ResidentPeaks``' C++ twin,
``use_native``) and the tracker calls the probe, for CUDA's peaks, only once CUDA is
initialised: a CPU step's memory costs no Python call.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..._native_module import native as _native

_log = logging.getLogger(__name__)

#: (allocated, reserved, resident peak bytes or None, out-of-memory errors caught)
Memory = tuple[int | None, int | None, int | None, int]
Stats = Mapping[str, Any]  # torch._C._cuda_memoryStats' nested dict
Kept = dict[tuple[str, ...], int]  # a peak's path -> the running max across otelprof's resets


def fold_peaks(kept: Kept, stats: Stats, path: tuple[str, ...] = ()) -> None:
    """Keeps the running max of every ``peak`` entry of ``stats`` (before otelprof resets it)."""
    for key, value in stats.items():
        if isinstance(value, Mapping):
            fold_peaks(kept, value, (*path, key))
        elif key == "peak" and isinstance(value, int):
            where = (*path, key)
            kept[where] = max(kept.get(where, 0), value)


def with_kept(stats: Stats, kept: Kept, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """``stats`` as the user would read them without otelprof: every peak the max of the kept
    one and the current one (a copy; ``stats`` is not changed)."""
    out: dict[str, Any] = {}
    for key, value in stats.items():
        if isinstance(value, Mapping):
            out[key] = with_kept(value, kept, (*path, key))
        elif key == "peak" and isinstance(value, int):
            out[key] = max(value, kept.get((*path, key), 0))
        else:
            out[key] = value
    return out


def step_peaks(stats: Stats) -> tuple[int | None, int | None]:
    """(allocated, reserved) peak bytes of all pools, from the nested stats."""

    def peak(kind: str) -> int | None:
        value = stats.get(kind, {}).get("all", {}).get("peak")
        return value if isinstance(value, int) else None

    return peak("allocated_bytes"), peak("reserved_bytes")


class CudaPeaks:
    """The caching allocator's per-step peaks of the current device, with the user's view kept."""

    def __init__(self, torch_c: Any) -> None:
        self._c = torch_c
        self._stats: Callable[[int], Stats] = torch_c._cuda_memoryStats
        self._reset: Callable[[int], None] = torch_c._cuda_resetPeakMemoryStats
        self.kept: dict[int, Kept] = {}  # the session's: a reset while none runs is not seen
        self._lock = threading.Lock()  # the user's reset may run on another thread than the step's
        torch_c._cuda_memoryStats = self._user_stats
        torch_c._cuda_resetPeakMemoryStats = self._user_reset

    def _user_stats(self, device: int) -> dict[str, Any]:
        stats = self._stats(device)
        with self._lock:
            return with_kept(stats, self.kept.get(device, {}))

    def _user_reset(self, device: int) -> None:
        self._reset(device)
        with self._lock:
            self.kept.pop(device, None)

    def read(self, device: int) -> tuple[int | None, int | None]:
        """The step's peaks on ``device``; its peaks then restart from what is held now."""
        with self._lock:
            stats = self._stats(device)
            fold_peaks(self.kept.setdefault(device, {}), stats)
            self._reset(device)
        return step_peaks(stats)

    def uninstall(self) -> None:
        """The originals back (a reading after this sees peaks since otelprof's last reset)."""
        if self._c._cuda_memoryStats == self._user_stats:
            self._c._cuda_memoryStats = self._stats
        if self._c._cuda_resetPeakMemoryStats == self._user_reset:
            self._c._cuda_resetPeakMemoryStats = self._reset


def vm_hwm_kib(status: bytes) -> int | None:
    """VmHWM (KiB) from /proc/<pid>/status."""
    at = status.find(b"VmHWM:")
    if at < 0:
        return None
    end = status.find(b"kB", at)
    try:
        return int(status[at + 6 : end])
    except ValueError:
        return None


def rusage_with_kept(usage: Any, kept_kib: int) -> Any:
    """``usage`` (a struct_rusage) with ru_maxrss raised to ``kept_kib``."""
    if usage.ru_maxrss >= kept_kib:
        return usage
    fields = list(usage)
    fields[2] = kept_kib  # ru_maxrss
    return resource.struct_rusage(fields)


#: steps between two comparisons of ru_maxrss with VmHWM (ResidentPeaks)
CHECK_EVERY = 16


#: KiB: the lifetime high-water mark otelprof's resets took away, the process's (nothing else
#: resets it, so a later session adds it back too)
_RESIDENT_KEPT = [0]


class ResidentPeaks:
    """The process's resident high-water mark per step, reset through /proc/self/clear_refs
    (Linux; elsewhere, or where it is not writable, the current RSS). Read as ``ru_maxrss``
    (getrusage: ~2 us, where reading /proc/self/status cost a small model's step ~20 us), which is
    the larger of the process's high-water mark and the one the kernel kept when the process
    exec'd (its launcher's, never reset): where that one is above a step's, ``VmHWM`` is read
    instead, from the first comparison that sees it on (at the start, then every
    ``CHECK_EVERY`` steps).

    With ``native`` (a ``_native.StepSink``), the sink reads it, the same way, at each training
    step it takes (no Python call per step); ``read()`` then asks the sink."""

    def __init__(self, native: Any = None) -> None:
        self._status = self._clear = -1
        self._exact = False  # VmHWM at every step: the exec'd image's mark is above the steps'
        self._steps = 0
        self._native = native
        self._getrusage = resource.getrusage
        resource.getrusage = self._user_getrusage
        self._fork_hook = native is None
        if native is not None:
            error = native.start_resident()  # reads once and compares, as below
            if error:
                _unavailable(error)
            return
        self._open()
        os.register_at_fork(after_in_child=self._after_fork)
        self.read()  # the first step's peak starts now
        self._check()  # the mark kept at exec (a launcher's) may be above the resident set now

    def _open(self) -> None:
        try:
            self._status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
            self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            _unavailable(exc)

    def _after_fork(self) -> None:
        """/proc/self opened by the parent is the parent's."""
        if not self._fork_hook:
            return
        for fd in (self._status, self._clear):
            if fd >= 0:
                os.close(fd)
        self._status = self._clear = -1
        self._open()

    @property
    def kept_kib(self) -> int:
        """The lifetime mark the resets took away, the Python readings' and the native ones'."""
        return max(_RESIDENT_KEPT[0], _native.StepSink.resident_kept_kib() if _native is not None else 0)

    def _user_getrusage(self, who: int) -> Any:
        usage = self._getrusage(who)
        return rusage_with_kept(usage, self.kept_kib) if who == resource.RUSAGE_SELF else usage

    def _vm_hwm(self) -> int | None:
        return vm_hwm_kib(os.pread(self._status, 4096, 0))

    def _check(self) -> int | None:
        """VmHWM (KiB); exact from now on where ru_maxrss reads above it."""
        try:
            status = self._vm_hwm()
            if status is not None and self._getrusage(resource.RUSAGE_SELF).ru_maxrss > status:
                self._exact = True
        except OSError:
            return None
        return status

    def read(self) -> int | None:
        """The step's resident peak (bytes); the high-water mark then restarts from now."""
        if self._native is not None:
            return self._native.read_resident()  # type: ignore[no-any-return]
        if self._status < 0 or self._clear < 0:
            return current_rss()
        try:
            self._steps += 1
            if self._exact:
                hwm = self._vm_hwm()
            elif self._steps % CHECK_EVERY == 0:
                hwm = self._check()
                if self._exact:
                    _log.info("otelprof: ru_maxrss keeps the exec'd image's mark, above the steps'; reading VmHWM")
            else:
                hwm = self._getrusage(resource.RUSAGE_SELF).ru_maxrss
            if hwm is None:
                return current_rss()
            if hwm > _RESIDENT_KEPT[0]:
                _RESIDENT_KEPT[0] = hwm
            os.write(self._clear, b"5")
        except OSError:
            return None
        return hwm * 1024

    def uninstall(self) -> None:
        if resource.getrusage == self._user_getrusage:
            resource.getrusage = self._getrusage
        if self._native is not None:
            self._native.stop_resident()
        self._fork_hook = False
        for fd in (self._status, self._clear):
            if fd >= 0:
                os.close(fd)
        self._status = self._clear = -1


def _unavailable(why: object) -> None:
    _log.info("otelprof: per-step resident peaks unavailable (%s); reporting the current RSS", why)


def current_rss() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryPeaks:
    """The session's probe: ``__call__()`` at each training step's end gives its memory
    (``StepRecord.memory``), kept as the last reading for the gauge."""

    def __init__(self, enabled: bool = True, on_cuda: Callable[[], None] | None = None) -> None:
        """``enabled`` False (OTELPROF_STEP_MEMORY): no peaks, only the OOMs caught;
        ``on_cuda()``: once, at the first step's end that finds CUDA initialised."""
        self.enabled = enabled
        self.resident = ResidentPeaks() if enabled else None
        self._on_cuda = on_cuda
        self.cuda: CudaPeaks | None = None
        self.device: int | None = None
        self._last: Memory | None = None
        self._sink: Any = None  # use_native's
        self.ooms = 0  # caught since the last step (oom.py's CUDA observer)
        self.oom_total: dict[str, int] = {}  # by device: the counter otelprof_oom_total
        self._failed = False

    @property
    def last(self) -> Memory | None:
        """The last training step's reading (natively: what the sink's last step took)."""
        if self._sink is not None:
            return self._sink.last_memory()  # type: ignore[no-any-return]
        return self._last

    def use_native(self, sink: Any) -> Callable[[], Memory | None]:
        """The native ``sink`` reads each training step's resident peak from now on; returns
        the tracker's probe (``attach``), due once CUDA is initialised, for what needs torch."""
        self._sink = sink
        if self.resident is not None:
            self.resident.uninstall()
            self.resident = ResidentPeaks(sink)
        return self._cuda_probe

    def _cuda_probe(self) -> Memory | None:
        return self._read(with_resident=False)

    def __call__(self) -> Memory | None:
        """The step's memory, read now (the Python route's, and an out-of-memory step's)."""
        return self._read(with_resident=True)

    def _read(self, with_resident: bool) -> Memory | None:
        if self._failed:
            return None
        try:
            allocated = reserved = resident = None
            torch = sys.modules.get("torch")
            cuda = torch is not None and torch.cuda.is_initialized()  # never initialise CUDA here
            if cuda and self._on_cuda is not None:
                on_cuda, self._on_cuda = self._on_cuda, None
                on_cuda()
            ooms, self.ooms = self.ooms, 0
            if not self.enabled:
                return None if not ooms else (None, None, None, ooms)
            if cuda:
                assert torch is not None
                if self.cuda is None:
                    self.cuda = CudaPeaks(torch._C)
                self.device = torch.cuda.current_device()
                allocated, reserved = self.cuda.read(self.device)
            if self.resident is not None and with_resident:
                resident = self.resident.read()
            self._last = (allocated, reserved, resident, ooms)
        except Exception:  # never into the training loop: the peaks stop, the steps go on
            self._failed = True
            _log.warning("otelprof: reading the step's memory peaks failed; they are off", exc_info=True)
            return None
        return self._last

    def count_oom(self, device: str) -> None:
        self.oom_total[device] = self.oom_total.get(device, 0) + 1

    def kept_rss(self) -> int | None:
        """The process's lifetime resident high-water mark (bytes), resets undone."""
        if self.resident is None:
            return None
        self.resident.read()
        return self.resident.kept_kib * 1024

    def uninstall(self) -> None:
        if self.resident is not None:
            self.resident.uninstall()
        if self.cuda is not None:
            self.cuda.uninstall()


class MemoryCollector(Collector):
    """``otelprof_step_memory_peak_bytes{device,kind}`` (the last step's) and
    ``otelprof_oom_total{device}``, read at scrape time (and bridged to OTLP)."""

    def __init__(self, labels: Mapping[str, str], peaks: MemoryPeaks) -> None:
        self._names = list(labels)
        self._values = list(labels.values())
        self._peaks = peaks

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        labels = [*self._names, "device", "kind"]
        peak = GaugeMetricFamily(
            "otelprof_step_memory_peak_bytes", "Peak memory of the last step, by device and kind.", labels=labels
        )
        last, device = self._peaks.last, self._peaks.device
        if last is not None:
            allocated, reserved, resident, _ = last
            cuda = f"cuda:{device}"
            for where, kind, value in ((cuda, "allocated", allocated), (cuda, "reserved", reserved)):
                if value is not None:
                    peak.add_metric([*self._values, where, kind], value)
            if resident is not None:
                peak.add_metric([*self._values, "cpu", "resident"], resident)
        yield peak
        oom = CounterMetricFamily(
            "otelprof_oom", "Out-of-memory errors, caught or not.", labels=[*self._names, "device"]
        )
        for where, count in sorted(self._peaks.oom_total.items()):
            oom.add_metric([*self._values, where], count)
        yield oom
