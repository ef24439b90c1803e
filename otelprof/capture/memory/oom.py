"""Out-of-memory errors: what the session records when one ends the training loop or is caught.

An OOM that escapes the loop reaches ``sys.excepthook`` (or ``threading.excepthook`` on a
thread): otelprof's hook, chained in front of the one there before, has the session record the
open step as a failed ``train.step`` (error status, an ``exception`` event with OpenTelemetry's
``exception.*`` attributes and what the allocator held), count it and deliver or spool before
the previous hook runs (the user's traceback is printed as ever). On CUDA, torch's
out-of-memory observer sees OOMs the loop catches itself too: counted and marked on the step.

A profiling window's memory timeline (by category) can leave its last peaks here
(``set_last_categories``) for the next OOM's event.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ...otlp.encoder import attributes, encode
from ...otlp.spans import Attrs, Span

_log = logging.getLogger(__name__)

#: What torch's CPU allocator says when it cannot allocate (c10/core/impl/alloc_cpu.cpp).
CPU_MESSAGES = ("can't allocate memory", "DefaultCPUAllocator: not enough memory")

Handler = Callable[[BaseException, str, bool], None]

_last_categories: tuple[str, dict[str, int]] | None = None


def set_last_categories(device: str, categories: Mapping[str, int]) -> None:
    """The last window's memory peaks by category (bytes) on ``device``: the memory timeline's
    hook. The next OOM's exception event carries them (``otelprof.memory.categories``)."""
    global _last_categories
    _last_categories = (device, dict(categories))


def last_categories() -> tuple[str, dict[str, int]] | None:
    return _last_categories


def oom_device(exc: BaseException) -> str | None:
    """``cuda:N`` or ``cpu`` when ``exc`` is an out-of-memory error, else None."""
    torch = sys.modules.get("torch")
    cuda_oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if cuda_oom is not None and isinstance(exc, cuda_oom):
        try:
            return f"cuda:{torch.cuda.current_device()}"  # type: ignore[union-attr]
        except Exception:
            return "cuda"
    if isinstance(exc, MemoryError):
        return "cpu"
    if isinstance(exc, RuntimeError) and any(m in str(exc) for m in CPU_MESSAGES):
        return "cpu"
    return None


def exception_attrs(exc: BaseException) -> Attrs:
    """OpenTelemetry's exception attributes (semantic conventions, exceptions)."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return [
        ("exception.type", name),
        ("exception.message", str(exc)),
        ("exception.stacktrace", "".join(traceback.format_exception(exc))),
    ]


def allocator_attrs(device: str, rss: Callable[[], int | None], kept_rss: Callable[[], int | None]) -> Attrs:
    """What the allocator held when the error came: CUDA's figures and summary, the process's
    resident set, the last window's categories (JSON)."""
    attrs: Attrs = [("otelprof.oom.device", device)]
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None:
        try:
            stats = torch.cuda.memory_stats()
            for key, name in (
                ("allocated_bytes.all.current", "otelprof.memory.allocated_bytes"),
                ("reserved_bytes.all.current", "otelprof.memory.reserved_bytes"),
                ("allocated_bytes.all.peak", "otelprof.memory.peak.allocated_bytes"),
                ("reserved_bytes.all.peak", "otelprof.memory.peak.reserved_bytes"),
                ("num_alloc_retries", "otelprof.memory.alloc_retries"),
                ("num_ooms", "otelprof.memory.allocator_ooms"),
            ):
                if isinstance(stats.get(key), int):
                    attrs.append((name, stats[key]))
            attrs.append(("otelprof.memory.summary", torch.cuda.memory_summary()))
        except Exception:
            _log.debug("otelprof: the CUDA allocator's figures could not be read", exc_info=True)
    current, kept = rss(), kept_rss()  # in this order: the mark is read after the resident set
    if current is not None:
        attrs.append(("otelprof.memory.resident_bytes", current))
    if kept is not None:
        attrs.append(("otelprof.memory.peak.resident_bytes", max(kept, current or 0)))
    if _last_categories is not None:
        where, categories = _last_categories
        attrs.append(("otelprof.memory.categories", json.dumps({"device": where, **categories}, sort_keys=True)))
    return attrs


def dump_snapshot(folder: Callable[[], Any], name: str) -> Path | None:
    """``torch.cuda.memory._snapshot()`` pickled into the kept traces' folder (``folder()``: a
    context giving its descriptor, checked private) when memory history was recorded; its path."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        snapshot = torch.cuda.memory._snapshot()
        if not any(snapshot.get("device_traces") or []):  # history recording is off
            return None
        data = pickle.dumps(snapshot)
        with folder() as fd:
            temp = f".oom-{os.getpid()}.tmp"
            out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            with os.fdopen(out, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        return Path(name)
    except Exception:
        _log.warning("otelprof: the CUDA memory snapshot could not be written", exc_info=True)
        return None


def snapshot_name(run_id: str | None, rank: int | None, step: int, at_ns: int) -> str:
    when = time.strftime("%Y%m%dT%H%M%S", time.gmtime(at_ns // 1_000_000_000))
    run = "".join(c if c.isalnum() or c in "._-" else "-" for c in (run_id or "run"))[:64].lstrip(".") or "run"
    return f"{run}_rank{rank or 0}_step{step}_{when}.oom_snapshot.pickle"


def error_requests(
    spans: list[Span], resource: Attrs, version: str, max_bytes: int, message: str, at_ns: int, event: Attrs
) -> list[bytes]:
    """The requests of ``spans`` (a step's, by the reference encoder), the first with error
    status and an ``exception`` event (the span model has neither: set on the messages)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    out = []
    for raw in encode(spans, resource, version, max_bytes):
        request = ExportTraceServiceRequest.FromString(raw)
        for span in request.resource_spans[0].scope_spans[0].spans:
            if span.span_id == spans[0].span_id:
                span.status.code = Status.STATUS_CODE_ERROR
                span.status.message = message
                span.events.add(time_unix_nano=at_ns, name="exception", attributes=attributes(event))
        out.append(request.SerializeToString(deterministic=True))
    return out


def failed_step_requests(
    spans: list[Span], encoder: Any, max_bytes: int, exc: BaseException, at_ns: int, event: Attrs, snapshot: str | None
) -> list[bytes]:
    """A failed step's spans (``StepRecordEncoder.spans``) as requests: error status, the
    ``exception`` event, the memory snapshot's file (if one was written) on the step span."""
    if snapshot is not None:
        spans[0].attrs.append(("otelprof.memory.snapshot.file", snapshot))
    message = f"{type(exc).__name__}: {exc}"
    return error_requests(spans, encoder.resource, encoder.version, max_bytes, message, at_ns, event)


class OomHooks:
    """``sys.excepthook`` and ``threading.excepthook``, chained: ``handler(exc, device, main)``
    runs for an out-of-memory error first, then the hook that was there before."""

    def __init__(self, handler: Handler) -> None:
        self._handler: Handler | None = handler
        self._sys_previous = sys.excepthook
        self._thread_previous = threading.excepthook
        sys.excepthook = self._sys_hook
        threading.excepthook = self._thread_hook

    def _run(self, exc: BaseException | None, main: bool) -> None:
        handler = self._handler
        device = oom_device(exc) if exc is not None else None
        if handler is None or device is None or exc is None:
            return
        try:
            handler(exc, device, main)
        except Exception:  # the user's traceback is printed whatever happens here
            _log.warning("otelprof: recording the out-of-memory error failed", exc_info=True)

    def _sys_hook(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        self._run(exc, True)
        self._sys_previous(kind, exc, tb)

    def _thread_hook(self, args: Any) -> None:
        self._run(args.exc_value, False)
        self._thread_previous(args)

    def uninstall(self) -> None:
        """The previous hooks back where ours are still in place; else ours pass through."""
        self._handler = None
        if sys.excepthook == self._sys_hook:
            sys.excepthook = self._sys_previous
        if threading.excepthook == self._thread_hook:
            threading.excepthook = self._thread_previous


_observer: list[Callable[[int], None] | None] = []  # torch keeps observers for good: one, redirected


def cuda_observed() -> bool:
    """Whether the CUDA observer counts OOMs now (an uncaught one was counted when raised)."""
    return bool(_observer) and _observer[0] is not None


def observe_cuda(on_oom: Callable[[int], None] | None) -> None:
    """``on_oom(device)`` for every CUDA OOM from now on, caught or not (torch's allocator
    observer, attached once per process; None stops the calls)."""
    if _observer:
        _observer[0] = on_oom
        return
    torch = sys.modules.get("torch")
    attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return
    _observer.append(on_oom)

    def observer(device: int, _alloc: int, _allocated: int, _free: int) -> None:
        callback = _observer[0]
        if callback is not None:
            callback(device)

    attach(observer)
