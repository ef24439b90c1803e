"""The background exporter: ``submit()`` returns at once whatever the network does; a worker
thread sends, retries as the OTLP specification allows, and spools what cannot be sent.

Policy, in order:
- no endpoint configured: every request goes to the spool (the embedded default destination);
- retryable failure: exponential backoff with jitter, capped, honouring the server's delay;
  after ``max_attempts`` the request is spooled and the backend is considered down; a server
  delay longer than the cap spools at once and the next probe waits that long, but never
  longer than ``max_server_delay_s`` (a huge, infinite or malformed delay is clamped);
- backend down: new requests are spooled; every ``probe_interval_s`` the oldest spooled request
  is retried, and once one succeeds the spool is replayed in order before anything newer;
- non-retryable failure: the request is dropped, counted, and the backend's message logged once;
- the in-memory queue is bounded in bytes; when full, the request goes to the spool through a
  second bounded queue and its own thread (overflow.py), and is dropped (counted) past that;
- on start, a spool left by an earlier run is replayed before anything new is sent; one process
  at a time replays a directory (Spool.replay_lock);
- every record carries its destination (destination.py): the exporter replays only records
  spooled for its own endpoint, protocol and headers, never another tenant's or endpoint's;
- a spool that cannot be written (read-only, full, not creatable) does not stop export: what
  would have gone there is dropped, counted by reason and logged once;
- the worker survives anything a server sends or a bug raises: each loop iteration is guarded,
  the error logged once and counted (``otelprof_export_worker_errors_total``), the request in
  hand spooled rather than lost;
- a TLS problem is named in one warning: unusable TLS files (``TLS_CONFIG``) spool at once,
  without retries, until fixed; a failed handshake is retried and spooled as any failure;
- ``shutdown(timeout_s)`` keeps one deadline in all: it delivers what it can until shortly
  before it, then interrupts the send in flight and spools that request and everything still
  queued or waiting for the spool writer (the one in flight may also have reached the backend:
  at least once).

Every request submitted ends exactly once as exported, spooled or dropped (a spooled one sent
later counts as replayed too); every request lost for good is counted in
``otelprof_export_dropped_requests_total{reason}``.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry

from ..settings import value
from ..settings.variables import OTELPROF_SPOOL_DIR
from .config import ExporterConfig, exporter_config_from_env
from .destination import describe, destination_id
from .overflow import OverflowWriter
from .redact import redact_url
from .result import MAX_SERVER_DELAY_S, TLS_CONFIG, ExportResult, server_delay
from .spool import Spool
from .telemetry import ExporterMetrics

_log = logging.getLogger(__name__)

DEFAULT_SPOOL_DIR = Path.home() / ".cache" / "otelprof" / "spool"
#: The exit deadline (docs/exporting.md): ``shutdown()`` at interpreter exit returns within about this.
EXIT_TIMEOUT_S = 5.0
#: Of a shutdown's time, the part kept for interrupting the send in flight and spooling what is
#: left (local disk writes), at most this much; the rest goes to delivering.
_SHUTDOWN_RESERVE_S = 1.0


def spool_dir_from_env(environ: Mapping[str, str] = os.environ) -> Path:
    """:envvar:`OTELPROF_SPOOL_DIR`, else ``~/.cache/otelprof/spool``."""
    folder: Path | None = value(environ, OTELPROF_SPOOL_DIR, _log)
    return folder or DEFAULT_SPOOL_DIR


Send = Callable[[bytes], ExportResult]


@dataclass
class ExporterCounters:
    """Plain counts, also exported as Prometheus metrics (telemetry.py)."""

    requests_exported: int = 0
    requests_spooled: int = 0
    requests_replayed: int = 0
    requests_dropped: int = 0
    spans_rejected: int = 0
    retries: int = 0
    worker_errors: int = 0
    dropped_by_reason: dict[str, int] = field(default_factory=dict)


class Sender(Protocol):
    def send(self, request: bytes) -> ExportResult: ...
    def interrupt(self) -> None: ...
    def close(self) -> None: ...


def sender(cfg: ExporterConfig) -> Sender:
    """The configured protocol's sender: one request at a time, interruptible from another thread."""
    if cfg.protocol == "grpc":
        from .grpc import GrpcSender

        return GrpcSender(cfg)
    from .http import HttpSender

    return HttpSender(cfg)


def transport(cfg: ExporterConfig) -> tuple[Send, Callable[[], None]]:
    one = sender(cfg)
    return one.send, one.close


class Exporter:
    _cond: threading.Condition
    _queue: deque[bytes]
    _queued_bytes: int
    _busy: bool
    _in_flight: bytes | None
    _closing: bool
    _closed: bool
    _backend_down: bool
    _next_probe: float
    _thread: threading.Thread

    def __init__(
        self,
        config: ExporterConfig | None = None,
        *,
        spool_dir: str | os.PathLike[str] | None = None,
        spool_max_bytes: int = 256 * 1024 * 1024,
        queue_max_bytes: int = 64 * 1024 * 1024,
        overflow_max_bytes: int | None = None,
        max_attempts: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        probe_interval_s: float = 5.0,
        max_server_delay_s: float = MAX_SERVER_DELAY_S,
        registry: CollectorRegistry | None = None,
        signal: str = "traces",
    ) -> None:
        self.config = config or exporter_config_from_env()
        self.spool = Spool(spool_dir or spool_dir_from_env(), spool_max_bytes)  # never raises
        self.destination = destination_id(self.config)
        self._description = describe(self.config)
        self.counters = ExporterCounters()
        # counters: the worker, the spool writer and submit() count; reentrant, for a shutdown()
        # from a signal handler that interrupted the main thread while it counted
        self._lock = threading.RLock()
        # shared by every exporter of the process that uses the same registry
        self.signal = signal  # the OTLP signal it sends: the signal label of its series (telemetry.py)
        self.registry = registry  # None: prometheus-client's global one
        self.metrics = ExporterMetrics.for_registry(registry).signal(signal)
        self.metrics.watch(lambda: self.queue_depth, self.spool.bytes_used)
        self._queue_max_bytes = queue_max_bytes
        self._max_attempts = max_attempts
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._probe_interval_s = probe_interval_s
        self._max_server_delay_s = max_server_delay_s
        self._unremovable: set[Path] = set()  # replayed records a read-only spool kept
        self._sender = sender(self.config)
        self._send, self._close = self._sender.send, self._sender.close
        self._warned: set[str] = set()
        self._overflow = OverflowWriter(
            lambda request: self._to_spool(request, "the export queue is full"),
            queue_max_bytes if overflow_max_bytes is None else overflow_max_bytes,
        )
        self._start(replay_spool=True)
        # weak references: an exporter nobody holds can still be collected
        self_ref = weakref.ref(self)

        def at_exit() -> None:
            exporter = self_ref()
            if exporter is not None:
                exporter.shutdown(timeout_s=EXIT_TIMEOUT_S)

        def in_forked_child() -> None:
            exporter = self_ref()
            if exporter is not None:
                exporter._after_fork()

        atexit.register(at_exit)
        os.register_at_fork(after_in_child=in_forked_child)

    # --- producer side (any thread; never blocks on the network, never raises) ------------

    def submit(self, request: bytes) -> None:
        try:
            if self.config.disabled:
                self._drop("disabled")
                return
            with self._cond:
                closed = self._closed
                overflow = closed or self._queued_bytes + len(request) > self._queue_max_bytes
                if not overflow:
                    self._queue.append(request)
                    self._queued_bytes += len(request)
                    self._cond.notify()
            if closed:  # a late request at exit: straight to the spool, for the next start
                self._to_spool(request, "the exporter is shut down")
            elif overflow and not self._overflow.put(request):
                self._drop("queue_full")
                self._warn_once("overflow", "export queue and spool writer are both full: dropping requests")
        except Exception:  # never into the training loop
            self._drop("error")
            self._warn_once("submit", "dropping a request after an unexpected error", exc_info=True)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Waits until the queue is empty and nothing is in flight; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def shutdown(self, timeout_s: float = EXIT_TIMEOUT_S) -> None:
        """Delivers what it can, then spools the rest, returning within about ``timeout_s`` in
        all: the request in flight at the deadline is interrupted and spooled with whatever is
        still queued (it may also have reached the backend: at least once, never lost).
        Idempotent; any thread, while the worker is mid-send too. Spooling what is left is local
        disk writes: a disk that takes long makes it return late rather than lose requests."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
        timeout_s = max(timeout_s, 0.0)
        deadline = time.monotonic() + timeout_s
        if not self._paused:  # a paused worker (a with_stack profile at exit) delivers nothing
            self.flush(timeout_s - min(_SHUTDOWN_RESERVE_S, timeout_s / 5))
        with self._cond:
            self._closed = True
            leftover = [] if self._in_flight is None else [self._in_flight]  # the oldest: first
            self._in_flight = None  # the worker's send, whatever it returns, no longer counts
            leftover.extend(self._queue)
            self._queue.clear()
            self._queued_bytes = 0
            self._cond.notify_all()
        self._sender.interrupt()  # a send (or replay) in flight ends now
        for request in leftover:
            self._to_spool(request, "shutting down")
        for request in self._overflow.close(deadline - time.monotonic()):
            self._to_spool(request, "shutting down")
        self._thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        self._close()

    def pause_worker(self, wait_s: float) -> None:
        """Stops the worker thread, keeping the queue (submit() goes on queueing, bounded as
        ever): another profiler is about to trace every Python thread. Waits up to ``wait_s``
        for a request in flight."""
        with self._cond:
            self._paused = True
            self._cond.notify_all()
        self._sender.interrupt()  # a send in flight (a slow backend) ends now: it goes first again
        self._thread.join(wait_s)

    def resume_worker(self) -> None:
        """Starts the worker again after ``pause_worker()``."""
        with self._cond:
            self._paused = False
            if self._closed or self._thread.is_alive():
                return  # one still finishing a send sees _paused cleared and goes on
            self._thread = threading.Thread(target=self._run, name="otelprof-exporter", daemon=True)
            self._thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def losses(self) -> int:
        """Requests lost for good so far (every reason): a caller that must know whether what
        it submitted was delivered (``otelprof import``'s ledger) compares it before and after."""
        with self._lock:
            return self.counters.requests_dropped + self.counters.dropped_by_reason.get("spool_evicted", 0)

    # --- worker ---------------------------------------------------------------------------

    def _start(self, replay_spool: bool) -> None:
        self._cond = threading.Condition()
        self._queue = deque()
        self._queued_bytes = 0
        self._busy = False
        self._in_flight = None  # popped by the worker, not yet exported, spooled or dropped
        self._closing = False
        self._closed = False
        self._paused = False
        # "down" until the spool an earlier run left is replayed, so nothing newer overtakes it
        mine = self.spool.records(self.destination) if self.config.endpoint_configured else []
        self._backend_down = not self.config.endpoint_configured or (replay_spool and bool(mine))
        if replay_spool and self.config.endpoint_configured:
            others = len(self.spool.records()) - len(mine)
            if others:
                _log.info(
                    "%d spooled requests in %s are for other destinations (or name none) and stay there; "
                    "`otelprof spool ls` shows them, `otelprof spool replay` sends them",
                    others,
                    self.spool.directory,
                )
        self._next_probe = 0.0
        self._thread = threading.Thread(target=self._run, name="otelprof-exporter", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        """A forked child (e.g. a DataLoader worker) starts clean: no inherited lock, queue,
        thread or channel. Its own submissions get a fresh worker."""
        self._lock = threading.RLock()  # a parent thread may have held it at fork
        self.spool.after_fork()
        self._sender = sender(self.config)
        self._send, self._close = self._sender.send, self._sender.close
        self._overflow.after_fork()
        self._start(replay_spool=False)  # the parent replays; two replayers would send twice

    def _run(self) -> None:
        while True:
            request: bytes | None = None
            try:  # everything, waiting included: no value a server sends may end this thread
                with self._cond:
                    while not self._queue and not self._closed and not self._paused and not self._probe_due():
                        self._cond.wait(self._probe_wait())
                    if self._closed or self._paused:
                        return
                    if self._queue:
                        request = self._in_flight = self._queue.popleft()
                        self._queued_bytes -= len(request)
                    self._busy = True
                if self._probe_due():
                    self._probe_and_replay()
                if request is not None:
                    self._deliver(request)
                    request = None
            except Exception:
                self._survive(request)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _survive(self, request: bytes | None) -> None:
        """An unexpected error in the worker: logged once, counted; the request in hand is
        spooled (it may have reached the backend: at least once, never lost); the probe is
        rescheduled sanely and the worker pauses, so a persistent error cannot spin."""
        with self._lock:
            self.counters.worker_errors += 1
        self.metrics.worker_errors.inc()
        self._warn_once("worker", "export worker error (the worker goes on)", exc_info=True)
        self._next_probe = time.monotonic() + self._probe_interval_s
        if request is not None and self._claim():
            self._to_spool(request, "")
            self._backend_down = True  # the spool goes first again: newer requests wait behind it
        with self._cond:
            if not self._closed:
                self._cond.wait(min(self._probe_interval_s, 1.0))

    def _probe_due(self) -> bool:
        return self._backend_down and self.config.endpoint_configured and time.monotonic() >= self._next_probe

    def _probe_wait(self) -> float | None:
        if not (self._backend_down and self.config.endpoint_configured):
            return None
        longest = max(self._probe_interval_s, self._max_server_delay_s)
        wait = self._next_probe - time.monotonic()
        return min(max(0.01, wait), longest) if wait == wait else 0.01  # NaN: probe now

    def _claim(self) -> bool:
        """Whether the request the worker popped is still its own to count: False once
        ``shutdown()`` took it at its deadline (and spooled it)."""
        with self._cond:
            mine = self._in_flight is not None
            self._in_flight = None
            return mine

    def _deliver(self, request: bytes) -> None:
        if self._closed:  # shutdown took it meanwhile (and spooled it): no late send
            self._claim()
            return
        if self._backend_down:
            if self._claim():
                self._to_spool(request, "the backend is unreachable" if self.config.endpoint_configured else "")
            return
        result = self._send_with_retries(request)
        if not self._claim():
            return  # shutdown's deadline passed meanwhile: it spooled the request
        if result.ok:
            self._count("requests_exported")
            if result.rejected_spans:
                self._count("spans_rejected", result.rejected_spans)
                what = "spans" if self.signal == "traces" else self.signal  # a partial success counts these
                self._warn_once("partial", f"the backend rejected %d {what}: %s", result.rejected_spans, result.message)
            return
        if self._paused and result.retryable:  # interrupted by pause_worker(): sent again first
            with self._cond:
                self._queue.appendleft(request)
                self._queued_bytes += len(request)
            return
        if result.retryable:
            self._backend_down = True
            self._next_probe = time.monotonic() + max(self._probe_interval_s, self._server_delay(result) or 0.0)
            if result.problem:  # its own warning says it, and that requests are spooled
                self._warn_once(
                    result.problem, "%s; spooling requests to %s meanwhile", result.message, self.spool.directory
                )
                self._warned.add("spooling")
            self._to_spool(request, "" if result.problem else f"the backend is failing ({result.message})")
        else:
            self._drop("rejected")
            self._warn_once("rejected", "the backend rejected a request, dropped: %s", result.message)

    def _server_delay(self, result: ExportResult) -> float | None:
        """The delay the server asked for, bounded (a transport of our own already bounds it;
        this holds for any ``send``)."""
        return server_delay(result.retry_after_s, self._max_server_delay_s)

    def _send_with_retries(self, request: bytes) -> ExportResult:
        delay = self._backoff_s
        for attempt in range(1, self._max_attempts + 1):
            result = self._timed_send(request)
            if result.ok or result.problem == TLS_CONFIG:  # the latter: no use retrying now
                return result
            if not result.retryable or attempt == self._max_attempts or self._closed or self._paused:
                return result
            asked = self._server_delay(result)
            if asked is not None and asked > self._max_backoff_s:
                return result  # a long throttle: spool, and probe again when the server said
            self._count("retries")
            wait = asked if asked is not None else delay * random.uniform(0.5, 1.5)
            with self._cond:  # a pause or shutdown ends the wait (the request is then spooled)
                self._cond.wait_for(lambda: self._paused or self._closed, min(wait, self._max_backoff_s))
            delay = min(delay * 2, self._max_backoff_s)
        return result  # pragma: no cover - the loop always returns

    def _probe_and_replay(self) -> None:
        """Backend marked down: retry the spool oldest first; stop at the first failure."""
        with self.spool.replay_lock() as mine:
            if not mine:  # another process is replaying this directory; ours wait their turn
                self._next_probe = time.monotonic() + self._probe_interval_s
                return
            records = [r for r in self.spool.records(self.destination) if r not in self._unremovable]
            for record, request in self.spool.read(records):
                if self._closed:  # shut down: the rest waits for the next start
                    return
                result = self._timed_send(request)
                if not result.ok and result.retryable:
                    self._next_probe = time.monotonic() + self._probe_interval_s
                    return
                if not self.spool.remove(record):  # a read-only spool: never send it again from here
                    self._unremovable.add(record)
                if result.ok:
                    self._count("requests_replayed")
                else:
                    self._drop("rejected")
                    self._warn_once("rejected", "the backend rejected a spooled request, dropped: %s", result.message)
        self._backend_down = False
        _log.info("OTLP backend %s is reachable again; spool replayed", redact_url(self.config.url))

    def _to_spool(self, request: bytes, why: str) -> None:
        """Never raises: a request the spool refuses is dropped, counted with the spool's reason
        (the spool logs each reason once)."""
        try:
            evicted = self.spool.counters.evicted
            failure = self.spool.store(request, self.destination, self._description)
            newly_evicted = self.spool.counters.evicted - evicted
            if newly_evicted:
                self.metrics.spool_evicted.inc(newly_evicted)
                self._drop("spool_evicted", newly_evicted, as_request=False)
        except Exception:
            failure = "error"
            self._warn_once("spool-error", "cannot spool a request", exc_info=True)
        if failure is None:
            self._count("requests_spooled")
            if why:
                self._warn_once("spooling", "spooling export requests to %s: %s", self.spool.directory, why)
        else:
            self._drop(failure)

    def _drop(self, reason: str, amount: int = 1, *, as_request: bool = True) -> None:
        """A loss, by reason. ``as_request``: also ``requests_total{result="dropped"}``, which
        counts what became of each request once (an evicted one was counted spooled)."""
        with self._lock:
            by_reason = self.counters.dropped_by_reason
            by_reason[reason] = by_reason.get(reason, 0) + amount
        self.metrics.drop(reason, amount)
        if as_request:
            self._count("requests_dropped", amount)

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + amount)
        if name.startswith("requests_"):
            self.metrics.requests[name.removeprefix("requests_")].inc(amount)
        elif name == "retries":
            self.metrics.retries.inc(amount)
        else:
            self.metrics.spans_rejected.inc(amount)

    def _timed_send(self, request: bytes) -> ExportResult:
        start = time.perf_counter()
        try:
            return self._send(request)
        finally:
            self.metrics.duration.observe(time.perf_counter() - start)

    def _warn_once(self, key: str, message: str, *args: object, exc_info: bool = False) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log.warning(message, *args, exc_info=exc_info)
