"""Saved profiling windows, converted and submitted on a thread of otelprof's own.

One thread, started when the first window begins (a process that never profiles has none), niced so
the training thread gets the CPU first, and run on one converter thread: a window's conversion
runs beside training and must not take a second core. ``pause()`` stops it once what is queued
is converted (see ``coexist.quiet``); the next trace starts another. otelprof's own windows
(``profiling.py``) and the user's (``handler.py``) both come here. otelprof's own are also kept
as gzip-compressed Kineto traces (``keep.py``) before they are converted, the kept file named on
their trace roots.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...converter import ConvertOptions, LiveStep, convert
from ...converter._options import LiveMatch
from ...converter.execution_trace import op_attributes, read_execution_trace
from ..announce import window_line
from ..memory import oom
from ..memory.spans import memory_requests
from ..memory.timeline import DeviceMemory, peaks_by_device, safe_window_memory
from ..metrics.mfu import Mfu, WindowFlops, window_flops
from ..metrics.window_metrics import WindowMetrics, summarize
from .keep import EXECUTION_TRACE, TraceKeeper, trace_name

if TYPE_CHECKING:
    from ..profiles import WindowProfiles

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Job:
    """A window to convert: torch's results (saved on the conversion thread) or a saved file."""

    source: Any
    trigger: str  # early, schedule, on_demand, anomaly; user: the user's own profiler's
    live: tuple[LiveStep, ...] = ()
    live_match: LiveMatch = "number"  # "time" for the user's windows: their steps have their own numbers
    unfinished: int | None = None  # ProfilerStep#N of the step the run ended in: not sent
    ended_ns: int = dataclasses.field(default_factory=time.time_ns)  # when the window was handed over
    memory: Any = None  # torch's results, for the memory timeline (a window with profile_memory)
    flops: Any = None  # torch's results of a with_flops window, for its FLOPs (metrics/mfu.py)
    execution_trace: Path | None = None  # the window's execution trace (a temp file: removed when done)


class Conversions:
    def __init__(
        self,
        options: ConvertOptions,
        submit: Callable[[bytes], None],
        metrics: WindowMetrics | None = None,
        keeper: TraceKeeper | None = None,
    ) -> None:
        self._options = dataclasses.replace(options, threads=1)
        # set by the session that says where data goes: one stderr line per window of its own
        self.announce: Callable[[str], None] | None = None
        self._submit = submit
        self.metrics = metrics
        self.keeper = keeper  # otelprof's own windows' raw traces (never the user's)
        self.mfu: Mfu | None = None  # with_flops windows' FLOPs per step (set by the session)
        self.profiles: WindowProfiles | None = None  # with_stack windows' flame graphs (set by the session)
        self.save_threads: deque[str] = deque(maxlen=16)  # where each window's trace was saved
        self.memory_s: deque[float] = deque(maxlen=16)  # each memory timeline's time on this thread
        self.done = 0
        self.failed = 0
        self.unfinished_dropped = 0  # ProfilerStep#N traces of steps the run ended in, not sent
        # execution traces: nodes no op span had, ops with a record function id but no node
        self.et_nodes_unmatched = 0
        self.et_ops_missing = 0
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=4)
        self._worker: threading.Thread | None = None
        self._stopping: list[threading.Thread] = []  # paused ones, leaving once their jobs are done
        self._full_logged = False

    @property
    def options(self) -> ConvertOptions:
        return self._options

    def ready(self) -> None:
        """Starts the thread ahead of a window's end: a thread started there would take the GIL
        from the training thread in the step that pays the window's stop."""
        with self._lock:
            if self._worker is None:
                self._start_worker()

    def put(self, job: Job) -> bool:
        """Queues a window; False when windows arrive faster than they convert: the window is
        dropped (counted, its saved file removed, logged once)."""
        with self._lock:
            if self._worker is None:
                self._start_worker()
            try:
                self._jobs.put_nowait(job)
                return True
            except queue.Full:
                pass
        self.count_failure()
        if isinstance(job.source, Path):
            job.source.unlink(missing_ok=True)
        if job.execution_trace is not None:
            job.execution_trace.unlink(missing_ok=True)
        if not self._full_logged:
            self._full_logged = True
            _log.warning("otelprof: windows arrive faster than they convert; dropping them (counted)")
        return False

    def count_failure(self) -> None:
        self.failed += 1
        if self.metrics is not None:
            self.metrics.window_failed()

    def pause(self, wait_s: float) -> None:
        """Stops the thread once it has converted what is queued, waiting up to ``wait_s``."""
        with self._lock:
            worker, self._worker = self._worker, None
            if worker is None:
                return
            self._jobs.put(None)  # each thread leaves at one None: as many as were asked to stop
            self._stopping.append(worker)
        worker.join(wait_s)

    def close(self, timeout_s: float = 60.0) -> None:
        """Converts what is queued and stops every thread."""
        with self._lock:
            worker, stopping = self._worker, self._stopping
            if worker is None and not self._jobs.empty():
                worker = self._start_worker()  # a trace queued behind a pause's stop
            self._worker, self._stopping = None, []
        if worker is not None:
            self._jobs.put(None)
        for thread in [*stopping, worker]:
            if thread is not None:
                thread.join(timeout=timeout_s)

    def _start_worker(self) -> threading.Thread:
        worker = self._worker = threading.Thread(target=self._run, name="otelprof-windows", daemon=True)
        worker.start()
        return worker

    def _run(self) -> None:
        _lower_priority()
        while (job := self._jobs.get()) is not None:
            path: Path | None = job.source if isinstance(job.source, Path) else None
            et_path = job.execution_trace
            try:
                if path is None:
                    path = temp_path()
                    job.source.save(str(path))  # Kineto writes the JSON with the GIL released
                    self.save_threads.append(threading.current_thread().name)
                options = self._options
                kept = self._keep(job, path)
                if kept is not None:
                    options = dataclasses.replace(options, source_file=str(kept))
                if job.live:
                    options = dataclasses.replace(options, live_steps=job.live, live_match=job.live_match)
                if et_path is not None:
                    options = self._execution_trace(et_path, kept, options)
                trigger, unfinished, live = job.trigger, job.unfinished, job.live
                steps = [step.number for step in job.live]
                memory = self._memory(job)
                flops = self._flops(job.flops, unfinished)
                job = None  # torch's results are freed here, on this thread
                result = convert(path, options=options)
                self.et_nodes_unmatched += result.stats.get("op_attributes_unmatched", 0)
                self.et_ops_missing += result.stats.get("op_attributes_missing", 0)
                requests = result.requests
                if unfinished is not None:
                    requests = self._drop_unfinished(requests, unfinished)
                for request in [*requests, *memory_requests(memory, self._options)]:
                    self._submit(request)
                if self.profiles is not None and trigger != "user":
                    self.profiles.window(path, live, kept, options, result.window_id)
                self.done += 1
                if flops is not None and self.mfu is not None:  # before the window counts as done
                    self.mfu.window(flops)
                if self.metrics is not None:
                    self.metrics.window_done(trigger, summarize(result.ops))
                if self.announce is not None and trigger != "user":
                    self.announce(window_line(trigger, steps, result.stats.get("spans", 0), kept))
            except Exception:
                self.count_failure()
                _log.warning("otelprof: converting a profiling window failed", exc_info=True)
            finally:
                job = None
                if path is not None:
                    path.unlink(missing_ok=True)
                if et_path is not None:
                    et_path.unlink(missing_ok=True)

    def _execution_trace(self, et_path: Path, kept: Path | None, options: ConvertOptions) -> ConvertOptions:
        """``options`` with the window's execution trace joined (``op_attributes``) and, where the
        window's trace was kept, the execution trace kept beside it and named on its roots. An
        unreadable one costs its attributes, not the window."""
        try:
            attributes = op_attributes(read_execution_trace(et_path))
        except Exception:
            _log.warning("otelprof: reading a window's execution trace failed", exc_info=True)
            return options
        et_kept = None
        if kept is not None and self.keeper is not None:
            et_kept = self.keeper.keep_file_beside(kept, EXECUTION_TRACE, et_path)
        return dataclasses.replace(
            options, op_attributes=attributes, execution_trace_file=None if et_kept is None else str(et_kept)
        )

    def _flops(self, results: Any, unfinished: int | None) -> WindowFlops | None:
        """The window's FLOPs, if it counted them; a failure costs the MFU, not the window."""
        if results is None or self.mfu is None:
            return None
        try:
            return window_flops(results, unfinished)
        except Exception:
            _log.warning("otelprof: reading a window's FLOPs failed", exc_info=True)
            return None

    def _memory(self, job: Job) -> list[DeviceMemory]:
        """The window's memory by category and device (capture/memory/), counted in the
        window metrics; [] without torch's results or when torch's timeline fails."""
        if job.memory is None:
            return []
        start = time.perf_counter()
        failed = self.metrics.memory_failed if self.metrics is not None else (lambda: None)
        memory = safe_window_memory(job.memory, job.live, failed)
        self.memory_s.append(time.perf_counter() - start)
        peaks = peaks_by_device(memory)
        if peaks and self.metrics is not None:
            self.metrics.window_memory(peaks)
        for device in sorted(peaks, key=lambda d: d != "cpu"):  # an accelerator's last: an OOM's likelier place
            oom.set_last_categories(device, peaks[device][0])
        return memory

    def _keep(self, job: Job, path: Path) -> Path | None:
        """The window's trace kept (otelprof's own windows only); its path, or None. A window
        whose only step is the one the run ended in sends nothing: it is not kept either."""
        if self.keeper is None or not self.keeper.enabled or job.trigger == "user":
            return None
        if not job.live and job.unfinished is not None:
            return None
        first = job.live[0].number if job.live else None
        name = trace_name(self._options.run_id, self._options.rank, first, job.ended_ns)
        return self.keeper.keep(path, name)

    def _drop_unfinished(self, requests: list[bytes], number: int) -> list[bytes]:
        """``requests`` without the step trace of ``ProfilerStep#number``, a step the run ended
        in: its train.step never closed, so no live step takes the marker, and it would be a
        root trace of its own (counted in ``unfinished_dropped``)."""
        roots, requests = _without_root(requests, f"ProfilerStep#{number}")
        if roots:
            self.unfinished_dropped += 1
            _log.debug("otelprof: ProfilerStep#%d of the step the run ended in is not sent", number)
        return requests


def _without_root(requests: list[bytes], name: str) -> tuple[set[bytes], list[bytes]]:
    """The span ids of the root spans named ``name`` and the requests without them and every
    span under them (re-encoded where they held any; a request left empty goes). Only spans
    of their traces are looked at: another step's spans never go, whatever its trace."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    marker = name.encode()
    roots = {
        (span.trace_id, span.span_id)
        for data in requests
        if marker in data  # the name's bytes: only these requests are decoded here
        for rs in ExportTraceServiceRequest.FromString(data).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if span.name == name and not span.parent_span_id
    }
    if not roots:
        return set(), requests
    traces = {trace for trace, _span in roots}
    decoded = [
        ExportTraceServiceRequest.FromString(data) if any(t in data for t in traces) else None for data in requests
    ]
    children: dict[tuple[bytes, bytes], list[bytes]] = {}
    for request in decoded:
        for span in _spans(request):
            if span.trace_id in traces and span.parent_span_id:
                children.setdefault((span.trace_id, span.parent_span_id), []).append(span.span_id)
    gone, todo = set(roots), list(roots)
    while todo:
        trace, span_id = todo.pop()
        for child in children.get((trace, span_id), ()):
            if (trace, child) not in gone:
                gone.add((trace, child))
                todo.append((trace, child))
    out = []
    for data, request in zip(requests, decoded, strict=True):
        if request is None:
            out.append(data)
            continue
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                kept = [span for span in ss.spans if (span.trace_id, span.span_id) not in gone]
                del ss.spans[:]
                ss.spans.extend(kept)
            kept_scopes = [ss for ss in rs.scope_spans if ss.spans]
            del rs.scope_spans[:]
            rs.scope_spans.extend(kept_scopes)
        kept_resources = [rs for rs in request.resource_spans if rs.scope_spans]
        del request.resource_spans[:]
        request.resource_spans.extend(kept_resources)
        if request.resource_spans:
            out.append(request.SerializeToString())
    return {span for _trace, span in roots}, out


def _spans(request: Any) -> Iterator[Any]:
    if request is not None:
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                yield from ss.spans


def temp_path(suffix: str = ".json") -> Path:
    fd, name = tempfile.mkstemp(prefix="otelprof-window-", suffix=suffix)
    os.close(fd)
    return Path(name)


#: Niceness of the conversion thread: on a machine with few free cores the training thread
#: gets the CPU first, and the window's conversion takes the time left over.
CONVERT_NICENESS = 10


def _lower_priority() -> None:
    """Linux schedules threads one by one: this lowers the calling thread only."""
    with contextlib.suppress(AttributeError, OSError):
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, current + CONVERT_NICENESS))
