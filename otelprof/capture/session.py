"""``instrument()`` / ``uninstrument()``: the live side of otelprof in one process.

A session wires the torch hooks (steps/hooks.py) to the step tracker, and each completed step
to the metrics (with the step's trace id as exemplar) and to a step span. Nothing here raises
into the training loop; ``instrument()`` twice warns and keeps the first session.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from .._version import __version__
from ..converter import LiveStep
from ..export import exporter_config_from_env, sdk_route
from ..export.exporter import Exporter, spool_dir_from_env
from ..otlp import ids
from ..otlp.resource import ResourceFacts, compose_resource
from ..otlp.spans import Attrs
from ..resource import options_from_env, resource_attributes_from_env
from ..settings import value
from ..settings.variables import (
    OTELPROF_MAX_REQUEST_BYTES,
    OTELPROF_OOM_WAIT,
    OTELPROF_PEAK_FLOPS,
    OTELPROF_SIGTERM_GRACE,
    OTELPROF_STEP_MEMORY,
)
from . import announce, coexist
from .config import Settings, settings_from_env
from .distributed import ranks as distributed
from .distributed.identity import Identity, identity_from_env
from .memory import oom
from .memory.peaks import MemoryCollector, MemoryPeaks, current_rss
from .metrics import otlp_metrics
from .metrics import server as metrics_server
from .metrics.mfu import Mfu
from .metrics.step_metrics import StepMetrics
from .metrics.window_metrics import WindowMetrics
from .preemption import Preemption
from .spans.step_spans import (
    StepContext,
    StepRecord,
    StepSpans,
    current_parent,
    native_sink,
    otel_context_var,
)
from .steps.device_timing import cuda_timing
from .steps.native_tracker import step_tracker
from .steps.step import Step
from .windows.keep import TraceKeeper, keep_from_env
from .windows.profiling import Windows

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_session: Session | None = None


class Session:
    """Hooks go in at once; the exporter, the span thread and the /metrics endpoint start with
    the first completed step, so processes that never train (launcher agents, DataLoader
    workers, tools) cost nothing and take no port."""

    def __init__(
        self,
        settings: Settings,
        identity: Identity,
        registry: CollectorRegistry,
        exporter: Exporter | None,
        environ: Mapping[str, str],
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        import torch

        from .steps.hooks import TorchHooks, log_failure  # imports torch

        self.settings = settings
        self.identity = identity
        self.registry = registry
        self.exporter = exporter
        self._owns_exporter = False  # one it creates is shut down with it; a caller's is not
        self._environ = dict(environ)
        # an SDK TracerProvider / MeterProvider the caller passed (docs/opentelemetry-sdk.md)
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self.route: sdk_route.TraceRoute | None = None
        #: called first when the session ends, whoever ends it (uninstrument(), exit, SIGTERM)
        self.on_close: list[Callable[[], None]] = []
        self.metrics: StepMetrics | None = None
        self.spans: StepSpans | None = None
        self.windows: Windows | None = None
        self.profiles_exporter: Exporter | None = None  # with_stack windows' profiles (capture/profiles/)
        self.straggler: distributed.Straggler | None = None
        self.mfu: Mfu | None = None  # with_flops windows: FLOPs per step and MFU (metrics/mfu.py)
        self.timing = cuda_timing(self._record) if settings.cuda_events else None
        clock = self.timing.clock if self.timing is not None else time.time_ns
        self.tracker = step_tracker(
            self._on_step,
            clock=clock,
            on_first_open=self._first_step_begins,
            on_error=log_failure,
            grad_enabled=torch.is_grad_enabled,
            on_hint=self._no_steps,
        )
        self.hooks = TorchHooks(self.tracker)
        self.metrics_server: Any = None
        self.otlp_metrics: otlp_metrics.OtlpMetrics | None = None
        self.metrics_port: int | None = None
        self._failed = False
        self._sink: Any = None
        self._window: str | None = None  # the open step's profiling-window mark (Windows.mark)
        self._quiet: list[Callable[[], None]] = []  # coexist.quiet registrations of the threads
        #: the open step's number and start (ns): what an out-of-memory error ends (memory/oom.py)
        self._open_step: tuple[int, int] | None = None
        self.peaks: MemoryPeaks | None = None  # made at the first step: the probe of its end
        self._oom: oom.OomHooks | None = oom.OomHooks(self._on_oom)
        self.hooks.install()
        self.preemption: Preemption | None = Preemption(
            value(self._environ, OTELPROF_SIGTERM_GRACE, _log),
            stop=self._stop_window,
            close=lambda grace_s: _close(self, grace_s),
            spool=self._spool_now,
            wake=self._wake,
        )
        if not self.preemption.install():
            self.preemption = None
        _import_first_step_modules(self._environ, self.settings.windows.with_stack)
        # from now on, a profiler the user makes is seen (one made before is found by active())
        coexist.watch(self._give_way)
        forward = self.hooks.forward
        if forward is not None:  # root discovery's global module hooks, out of with_stack profiles
            self._quiet.append(coexist.quiet(forward.pause, forward.resume))

    def _give_way(self, what: str) -> None:
        """Another profiler is about to start (coexist.py): a window in progress stops."""
        if self.windows is not None:
            self.windows.give_way(what)

    def _no_steps(self, forwards: int) -> None:
        """The tracker's hint (training thread, inside a hook): forwards run, nothing marks a step."""
        _hint(forwards)
        self.hooks.no_steps()

    def _first_step_begins(self, number: int) -> str | None:
        """Everything but the hooks starts here (training thread, inside a hook). Returns the
        first step's profiling-window mark (the native tracker puts it on the step's span)."""
        try:
            # torch.distributed's rank, the agreed run id (every rank is at this point)
            self.identity, self.straggler = distributed.join(self.identity, self._environ)
            exporter = self.exporter
            if exporter is None:
                exporter = self.exporter = Exporter(
                    exporter_config_from_env(self._environ, disabled=self.settings.sdk_disabled),
                    spool_dir=spool_dir_from_env(self._environ),
                    registry=self.registry,
                )
                self._owns_exporter = True
                # at exit the session must flush its last steps before the exporter shuts down
                # (atexit runs the latest registration first)
                atexit.unregister(_at_exit)
                atexit.register(_at_exit, self)
            self._open_step = (number, time.time_ns())
            self.metrics = StepMetrics(self.identity.labels(), self.registry)
            self._start_peaks()
            tracker = self.tracker
            self.metrics.count_eval(lambda: tracker.eval_forwards)
            if self.straggler is not None:
                self.straggler.register(self.identity.labels(), self.registry)
            # read once for the step spans and the windows' options (one warning each)
            attributes = resource_attributes_from_env(self._environ)
            max_request_bytes = value(self._environ, OTELPROF_MAX_REQUEST_BYTES, _log)
            resource = _resource(self.identity, self._environ, attributes)
            # the sampler and the SDK route between the spans and the exporter (export/sdk_route.py)
            route = self.route = sdk_route.route(self._environ, exporter.submit, self._tracer_provider)
            route.register(self.registry)
            self.metrics.keep_exemplar = None if route.sampler.keeps_all else route.sampler.sampled
            self.spans = StepSpans(route, self.identity, resource, self.metrics.span_dropped)
            self.spans.max_request_bytes = max_request_bytes
            metric_exporters = otlp_metrics.exporters(self._environ)
            if "prometheus" in metric_exporters:
                self._serve_metrics()
            if "otlp" in metric_exporters or self._meter_provider is not None:
                self._start_otlp_metrics(resource)
            if self.settings.windows.enabled:
                options = options_from_env(
                    self._environ,
                    run_id=self.identity.run_id,
                    rank=self.identity.rank,
                    world_size=self.identity.world_size,
                    scope_version=__version__,
                    # the step spans' resource, typed and whole: a window's spans share it (the
                    # trace adds only what it has and the session lacks: the GPU model)
                    resource_attributes=tuple(resource),
                    max_request_bytes=max_request_bytes,
                )
                window_metrics = WindowMetrics(self.identity.labels())
                self.metrics.add_collector(window_metrics)
                submit = route.submit
                self.windows = Windows(self.settings.windows, options, submit, window_metrics)
                self._window = self.windows.begin(number)
                self._quiet.append(coexist.quiet(self.windows.pause, lambda: None))
                if self.settings.windows.with_flops:
                    peak = value(self._environ, OTELPROF_PEAK_FLOPS, _log)
                    self.mfu = self.windows.conversions.mfu = Mfu(self.identity.labels(), peak)
                    self.metrics.add_collector(self.mfu)
                self._profiles(exporter)
            # a with_stack profile of the user's traces every Python thread: otelprof's step aside
            self._quiet.append(coexist.quiet(exporter.pause_worker, exporter.resume_worker))
            self._quiet.append(coexist.quiet(self.spans.pause, self.spans.resume))
            if self.metrics_server is not None:
                server = self.metrics_server
                pause, resume = metrics_server.pause, metrics_server.resume
                self._quiet.append(coexist.quiet(lambda wait: pause(server, wait), lambda: resume(server)))
            self._native_steps()
        except Exception:  # never into the training loop
            self._failed = True
            _log.warning("otelprof could not start; steps are not recorded", exc_info=True)
        else:
            try:  # a line not written must not stop the recording
                self._announce(metric_exporters)
            except Exception:
                _log.debug("otelprof: could not say where the data goes", exc_info=True)
        return self._window

    def _profiles(self, exporter: Exporter) -> None:
        """with_stack windows' flame graphs: the profiles signal's own exporter (the traces
        exporter's settings and rules), closed by close() after the last window."""
        assert self.windows is not None
        if not self.settings.windows.with_stack:
            return
        from . import profiles  # imported with instrument() already (_import_first_step_modules)

        conversions = self.windows.conversions
        if not profiles.export_enabled(self._environ):  # the files only
            conversions.profiles = profiles.WindowProfiles(None, conversions.keeper)
            return
        sender = self.profiles_exporter = profiles.exporter(exporter, self._environ)
        conversions.profiles = profiles.WindowProfiles(sender.submit, conversions.keeper)
        self._quiet.append(coexist.quiet(sender.pause_worker, sender.resume_worker))
        atexit.unregister(_at_exit)  # its own atexit shutdown came later: the session's goes first
        atexit.register(_at_exit, self)

    def _announce(self, metric_exporters: set[str]) -> None:
        """One stderr line: where this process's data goes (announce.py). Not for an exporter
        the caller passed in: its destination is the caller's to know."""
        if not self._owns_exporter or self.identity.local_rank != 0 or announce.quiet(self._environ):
            return
        assert self.exporter is not None
        host = self.settings.metrics_host
        metrics = announce.metrics_part(
            metric_exporters, host, self.metrics_port, self._environ, self.identity.world_size
        )
        http_trigger = self.settings.http_trigger and self.metrics_server is not None
        windows = self.settings.windows
        route = self.route
        otlp, sdk = (True, ()) if route is None else (route.otlp is not None, route.processors)
        spans = announce.spans_part(self.exporter.config, self.exporter.spool.directory, otlp, sdk)
        announce.announce(spans, metrics, windows, http_trigger)
        if self.windows is not None:
            self.windows.conversions.announce = announce.write_line

    def _native_steps(self) -> None:
        """Steps stay in the native core from the tracker to the metrics and the span queue (no
        Python object per step); the OTLP metrics record each from the sink's reading. A
        CUDA-timed step is held in the sink (its span ids and window mark taken) until its
        events complete, then released with the device's times (``_on_held``); the Python path,
        ``_on_step``, is the fallback without the native core."""
        assert self.metrics is not None and self.spans is not None
        attach = getattr(self.tracker, "attach", None)
        if attach is None or not self.spans.native_queue:
            return
        sink = self._sink = native_sink()
        if self.timing is not None:
            sink.hold(self.timing.max_pending + 1)  # drain_sink() releases past max_pending
        self.metrics.read_from(sink, self.spans.encoder.trace_ids)
        self.spans.use_sink(sink)
        on_held = self._on_held if self.timing is not None else None
        # the sink reads the CPU's peaks; the probe (torch's CUDA readings) once CUDA is initialised
        import torch.cuda

        probe = self.peaks.use_native(sink) if self.peaks is not None else None
        cuda = vars(torch.cuda)
        attach(sink, self._on_boundary, current_parent, otel_context_var(), self.spans.wake, on_held, probe, cuda)

    def _start_peaks(self) -> None:
        """The step-end probe (memory/peaks.py; its readings off with OTELPROF_STEP_MEMORY=false,
        the CUDA OOMs caught still marked) and its metrics."""
        assert self.metrics is not None
        enabled = value(self._environ, OTELPROF_STEP_MEMORY, _log)
        self.peaks = MemoryPeaks(enabled, on_cuda=lambda: oom.observe_cuda(self._caught_oom))
        self.metrics.add_collector(MemoryCollector(self.identity.labels(), self.peaks))

    def _caught_oom(self, device: int) -> None:
        """torch's allocator observer (inside the failed allocation): counted, and marked on
        the step (StepRecord.memory) when it ends."""
        if self.peaks is not None:
            self.peaks.ooms += 1
            self.peaks.count_oom(f"cuda:{device}")

    def _on_oom(self, exc: BaseException, device: str, main: bool) -> None:
        """An out-of-memory error escaped (oom.OomHooks): the open step as a failed span, the
        count, then delivered or spooled within OTELPROF_OOM_WAIT (on the main thread the
        session closes: the process is ending)."""
        if self.peaks is None or self.spans is None or self.route is None or self._failed:
            return  # no step yet: nothing to record it on
        if not (device.startswith("cuda") and oom.cuda_observed()):  # else counted when raised
            self.peaks.count_oom(device)
        for request in self._failed_step(exc, device):
            self.route.submit(request)
        wait = value(self._environ, OTELPROF_OOM_WAIT, _log)
        if main:
            _close(self, wait)
        elif self.exporter is not None:
            self.exporter.flush(wait)

    def _failed_step(self, exc: BaseException, device: str) -> list[bytes]:
        """The open step (from the last step's end) as a failed ``train.step`` (memory/oom.py)."""
        assert self.peaks is not None and self.spans is not None
        now = time.time_ns()
        start = self._open_step[1] if self._open_step is not None else now
        # this span is the open step's: the tracker drops it (in DataLoader mode it saw its
        # update, and finish() would close it again) and the next step is numbered after it
        number = self.tracker.abandon()
        self._open_step = (number + 1, now)
        memory = self.peaks()  # the failed step's peaks, and the OOMs it caught
        record = StepRecord(
            "train.step", number, start, now, self.spans.reserve(1), None, None, None, None, 0, [], 0, None
        )
        event = [*oom.exception_attrs(exc), *oom.allocator_attrs(device, current_rss, self.peaks.kept_rss)]
        snapshot = None
        if device.startswith("cuda"):
            keeper = TraceKeeper(keep_from_env(self._environ))
            name = oom.snapshot_name(self.identity.run_id, self.identity.rank, number, now)
            if oom.dump_snapshot(keeper.folder, name) is not None:
                snapshot = str(keeper.directory / name)
        spans = self.spans.encoder.spans(record._replace(memory=memory), 0)
        return oom.failed_step_requests(
            spans, self.spans.encoder, self.spans.max_request_bytes, exc, now, event, snapshot
        )

    def _on_boundary(self, number: int, seconds: float) -> str | None:
        """What a native step still does in Python (training thread; errors stop the tracker).
        Returns the next step's profiling-window mark (the tracker puts it on its span)."""
        self._open_step = (number + 1, time.time_ns())
        window = self._boundary(seconds, lambda: self._live_native(number), number)
        if self.timing is None:  # a CUDA-timed step: when the sink releases it
            if self.straggler is not None:
                self.straggler.observe(seconds)
            if self.mfu is not None:
                self.mfu.step_s = seconds
            if self.otlp_metrics is not None:
                self._otlp_native()
        return window

    def _on_held(self) -> None:
        """The sink holds a CUDA-timed step: release those the device has run (training thread;
        errors stop the tracker)."""
        assert self.timing is not None
        self.timing.drain_sink(self._sink, self._released)

    def _released(self, training: bool, wake: bool) -> None:
        """The sink folded and queued a CUDA-timed step with the device's times."""
        if wake and self.spans is not None:
            self.spans.wake()
        if training:
            if self.straggler is not None:
                self.straggler.observe(self._sink.folded().seconds)
            if self.mfu is not None:
                self.mfu.step_s = self._sink.folded().seconds
            if self.otlp_metrics is not None:
                self._otlp_native()

    def _otlp_native(self) -> None:
        """The OTLP metrics of the step the native sink just folded."""
        assert self.otlp_metrics is not None and self.spans is not None
        folded = self._sink.folded()
        if folded is None:
            return
        encoder = self.spans.encoder
        trace_id = folded.trace_id or encoder.trace_ids(str(folded.number))
        self.otlp_metrics.observe_folded(folded, trace_id, ids.span_id(encoder.span_base, folded.ordinal))

    def _boundary(self, seconds: float, live: Callable[[], LiveStep | None], number: int) -> str | None:
        """Every step, either path: root discovery, the profiler's step boundary; the next
        step's profiling-window mark."""
        self.hooks.step_done()
        coexist.resume_if_clear()
        if self.windows is not None:
            self._window = self.windows.boundary(seconds, live, number)
        return self._window

    def _live_native(self, number: int) -> LiveStep | None:
        """A profiled step's span ids, from the native sink that just queued it, and an interval
        inside the step's own: the sink gives its duration exactly but its end as a float Unix
        time (within 0.4 us), so the interval is narrowed by 1 us at either end. None for a
        CUDA-timed step (its span takes the device's times, unknown yet)."""
        sink = self._sink
        last = sink.last() if sink is not None and self.spans is not None else None
        if sink is None or last is None or last.number != number:  # the step's span was dropped (queue full)
            return None
        assert self.spans is not None
        encoder = self.spans.encoder
        trace_id = last.trace_id or encoder.trace_ids(str(number))
        start = end = 0
        folded = sink.folded() if self.timing is None else None
        if folded is not None and folded.ordinal == last.ordinal:
            end_s = sink.metrics().last_step
            duration, slack = round(folded.seconds * 1e9), 1000
            if end_s is not None and duration > 2 * slack:
                end = round(end_s * 1e9) - slack
                start = end + 2 * slack - duration
        names = tuple(getattr(last, "phase_names", ()))
        return _live_step(number, trace_id, encoder.span_base, last.ordinal, last.phases, start, end, names)

    def _live_python(self, step: Step, ctx: StepContext) -> LiveStep:
        """A profiled step's span ids and interval (none for a CUDA-timed step, as natively)."""
        assert self.spans is not None
        phases = [(start, end) for _name, start, end in step.phases]
        start, end = (step.start_ns, step.end_ns) if self.timing is None else (0, 0)
        names = tuple(name for name, _start, _end in step.phases)
        encoder = self.spans.encoder
        return _live_step(step.number, ctx.trace_id, encoder.span_base, ctx.ordinal, phases, start, end, names)

    def _on_step(self, step: Step) -> None:
        """A step ended on the CPU (training thread): the profiler's step boundary is here."""
        if self._failed or self.metrics is None or self.spans is None:
            return
        try:
            ctx = self.spans.context(step)  # the application's current span is on this thread
            if not step.evaluation:  # an evaluation is no training step: no boundary, no anomaly
                self._open_step = (step.number + 1, time.time_ns())
                if self.peaks is not None:
                    step.memory = self.peaks()
                step.window = self._window  # decided when the step began
                self._boundary(step.duration_s, lambda: self._live_python(step, ctx), step.number)
            if self.timing is not None:
                self.timing.add(step, ctx)  # recorded once the GPU has run it
            else:
                self._record(step, ctx)
        except Exception:  # never into the training loop
            self._failed = True
            _log.warning("otelprof stopped recording steps after an internal error", exc_info=True)

    def _record(self, step: Step, ctx: StepContext) -> None:
        assert self.metrics is not None and self.spans is not None
        if not step.evaluation:  # a span, in no step metric
            self.metrics.observe(step, ctx)
            if self.straggler is not None:
                self.straggler.observe(step.duration_s)
            if self.mfu is not None:
                self.mfu.step_s = step.duration_s
            if self.otlp_metrics is not None:
                self.otlp_metrics.observe(step, ctx.trace_id, self.spans.span_id(ctx))
        self.spans.add(step, ctx)

    def _serve_metrics(self) -> None:
        port = self.settings.metrics_port
        if port:
            port += self.identity.local_rank
        try:
            profile = self._profile_request if self.settings.http_trigger else None
            server = metrics_server.serve(
                self.settings.metrics_host, port, self.registry, profile, self.settings.trigger, self.identity.labels()
            )
        except OSError as exc:
            _log.warning(
                "cannot serve metrics on %s:%d (%s); set OTEL_EXPORTER_PROMETHEUS_PORT",
                self.settings.metrics_host,
                port,
                exc.strerror or exc,
            )
            return
        self.metrics_server = server
        self.metrics_port = int(server.server_port)
        _log.info("otelprof metrics on http://%s:%d/metrics", self.settings.metrics_host, self.metrics_port)

    def _start_otlp_metrics(self, resource: Attrs) -> None:
        try:
            route = self.route
            self.otlp_metrics = otlp_metrics.OtlpMetrics(
                self.registry,
                self.identity.labels(),
                dict(resource),
                self._environ,
                self._meter_provider,
                None if route is None or route.sampler.keeps_all else route.sampler.sampled,
            )
        except ImportError as exc:
            _log.warning(
                "OTEL_METRICS_EXPORTER=otlp needs the OpenTelemetry SDK and OTLP exporters "
                "(pip install 'otelprof[metrics]'): %s; metrics stay on /metrics only",
                exc,
            )

    def _profile_request(self, steps: int | None, min_interval_s: float) -> tuple[str, float]:
        """``POST /profile`` on the metrics port, authenticated (a server thread): "accepted",
        "busy", "too_soon" (``Windows.request_on_demand``) or "off", and the seconds to retry after."""
        if self.windows is None:
            return "off", 0.0
        return self.windows.request_on_demand(steps, min_interval_s)

    def close(self, grace_s: float | None = None) -> None:
        """The last step is closed first (its metrics scrapeable, its span in the final flush);
        /metrics keeps serving until the spans are flushed. ``grace_s`` (SIGTERM) bounds the
        whole close: the step spans go before a window's conversion, the exporter spools what
        it has not sent when the time is up."""
        deadline = None if grace_s is None else time.monotonic() + grace_s

        def left(default: float) -> float:
            return default if deadline is None else max(0.0, min(default, deadline - time.monotonic()))

        if self.preemption is not None:
            self.preemption.uninstall()
        if self._oom is not None:
            self._oom.uninstall()
            oom.observe_cuda(None)
        self.hooks.remove()
        self.tracker.finish()
        self.tracker.close()
        if self.timing is not None and not self._failed:
            try:
                if self._sink is not None:
                    self.timing.drain_sink(self._sink, self._released, wait=True)
                else:
                    self.timing.drain(wait=True)
            except Exception:
                _log.warning("otelprof: reading the last steps' CUDA events failed", exc_info=True)
        coexist.unwatch(self._give_way)
        for unregister in self._quiet:  # every thread runs again, for the final flush
            unregister()
        self._quiet = []
        if self.spans is not None:
            self.spans.close(left(5.0))
        if self.windows is not None:
            try:  # the exporter keeps a moment of the grace for spooling what is left
                self.windows.close(left(60.0) - (0.0 if grace_s is None else min(2.0, 0.3 * grace_s)))
            except Exception:
                _log.warning("otelprof: closing the profiling windows failed", exc_info=True)
        if self.route is not None:  # the SDK's processors get the last spans
            self.route.close(left(5.0))
        if self.profiles_exporter is not None:  # after the last window's profile
            self.profiles_exporter.shutdown(left(5.0))
        if self.exporter is not None:
            if self._owns_exporter:
                self.exporter.shutdown(left(5.0))  # flushes, spools what is left, stops its thread
            else:
                self.exporter.flush(left(5.0))
        if self.otlp_metrics is not None:  # after the last step and the exporter's last counts
            self.otlp_metrics.shutdown(left(5.0))
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        if self.metrics is not None:
            self.metrics.unregister()
        if self.peaks is not None:  # the process's own peak readings: the originals back
            self.peaks.uninstall()
        if self.route is not None:  # its counters, after the last metrics export
            self.route.unregister(self.registry)
        if self.straggler is not None:
            self.straggler.unregister(self.registry)

    def _stop_window(self) -> None:
        """SIGTERM, on the main thread: a window in progress stops (and is queued) here."""
        if self.windows is not None:
            self.windows.stop()

    def _spool_now(self, wait_s: float) -> None:
        """SIGTERM's grace is over and close() has not returned: the exporters spool their queues."""
        profiles = self.profiles_exporter
        share = wait_s / 2 if profiles is not None else wait_s  # the traces first, then the profiles
        if self.exporter is not None and self._owns_exporter:
            self.exporter.shutdown(share)
        if profiles is not None:
            profiles.shutdown(share)

    def _wake(self) -> None:
        if self.spans is not None:
            self.spans.wake()


def _import_first_step_modules(environ: Mapping[str, str], with_stack: bool = False) -> None:
    """What the first completed step would import, imported with instrument() (~2 ms): a module
    imported inside a user's with_stack profile leaves torch's Python tracer pointing into its
    freed code, and the user's events() raise UnicodeDecodeError. The threads and the port
    still wait for the first step."""
    import encodings.idna  # noqa: F401  (host names: /metrics' address, the exporter's connection)

    # the protocol as written (the exporter's own reading warns about a bad value, once, later)
    chosen = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    if chosen.strip().lower() == "grpc":
        from ..export import grpc  # noqa: F401
    else:
        from ..export import http  # noqa: F401
    otel_context_var()  # opentelemetry's context, if installed (the step spans' parent)
    if with_stack:
        from . import profiles  # noqa: F401  (the flame graphs' exporter, made at the first step)


def _hint(forwards: int) -> None:
    """The tracker's on_hint: forwards run, but nothing marks a step (logged once)."""
    _log.warning(
        "otelprof: %d forward passes and no optimizer.step() or otelprof.step(): no steps are recorded. "
        "Call otelprof.step() at the end of each iteration, or wrap each unit of work in "
        '`with otelprof.step_scope("name"):`',
        forwards,
    )


def _live_step(
    number: int,
    trace_id: bytes,
    base: int,
    ordinal: int,
    phases: list[tuple[int, int]],
    start_ns: int = 0,
    end_ns: int = 0,
    phase_names: tuple[str, ...] = (),
) -> LiveStep:
    """A step span's ids as the step encoders make them: the step's ordinal, then one per phase;
    ``[start_ns, end_ns]`` within the step (0, 0: unknown), that its ProfilerStep#N is cut to."""
    return LiveStep(
        number,
        trace_id,
        ids.span_id(base, ordinal),
        tuple((ids.span_id(base, ordinal + k), start, end) for k, (start, end) in enumerate(phases, 1)),
        start_ns=max(0, start_ns),
        end_ns=max(0, start_ns, end_ns),
        phase_names=phase_names if len(phase_names) == len(phases) else (),
    )


def _resource(
    identity: Identity, environ: Mapping[str, str], attributes: tuple[tuple[str, str], ...] | None = None
) -> Attrs:
    """``attributes``: the environment's resource attributes, when the caller has read them."""
    import socket

    facts = ResourceFacts(
        host_name=socket.gethostname(),
        pid=os.getpid(),
        rank=identity.rank,
        local_rank=identity.local_rank,
        world_size=identity.world_size,
        run_id=identity.run_id,
    )
    # telemetry.sdk.version as the converter's window resource has it (scope_version)
    if attributes is None:
        attributes = resource_attributes_from_env(environ)
    return compose_resource(attributes, __version__, facts)[0]


def instrument(
    *,
    environ: Mapping[str, str] | None = None,
    registry: CollectorRegistry | None = None,
    exporter: Exporter | None = None,
    tracer_provider: Any = None,
    meter_provider: Any = None,
) -> Session | None:
    """Starts step tracking, metrics and step spans for this process; returns the session,
    or None when disabled (``OTELPROF_ENABLED=false``, ``OTEL_SDK_DISABLED=true``) or when
    torch is missing. Calling it again returns the running session. ``tracer_provider``: an
    OpenTelemetry SDK ``TracerProvider`` whose sampler decides and whose span processors get
    the spans; ``meter_provider``: the ``MeterProvider`` the metrics are recorded through
    (docs/opentelemetry-sdk.md)."""
    global _session
    env = os.environ if environ is None else environ
    with _lock:
        if _session is not None:
            _log.warning("otelprof is already instrumenting this process; ignoring the second instrument()")
            return _session
        settings = settings_from_env(env)  # read (and warned about) once: not by a second call
        if not settings.enabled:
            return None
        try:
            import torch  # noqa: F401
        except ImportError:
            _log.warning("otelprof.auto needs torch (pip install 'otelprof[torch]'); not instrumenting")
            return None
        identity = identity_from_env(env)
        session = Session(settings, identity, registry or REGISTRY, exporter, env, tracer_provider, meter_provider)
        _session = session
    atexit.register(_at_exit, session)
    sdk_route.preload(env)  # now, not at the first step (maybe inside the user's profile)
    return session


def uninstrument() -> None:
    """Removes every hook, flushes the last steps and stops the metrics endpoint."""
    current = _session
    if current is not None:
        _close(current)


def _close(session: Session, grace_s: float | None = None) -> None:
    """Ends ``session`` if it is still the process's (once, whoever comes first: uninstrument(),
    exit, SIGTERM)."""
    global _session
    with _lock:
        if _session is not session:
            return
        _session = None
    for callback in session.on_close:  # (the framework callbacks come out: instrumentation.py)
        try:
            callback()
        except Exception:
            _log.warning("otelprof: a close callback failed", exc_info=True)
    session.close(grace_s)


def _at_exit(session: Session) -> None:
    _close(session)


def session() -> Session | None:
    return _session


def step(
    *,
    number: int | None = None,
    samples: int | None = None,
    tokens: int | None = None,
    micro_batches: int | None = None,
) -> None:
    """Ends the current step now (after the optimizer update), for loops the automatic rules do
    not fit and for framework callbacks; the automatic boundaries are off from then on.
    ``number``: the step's number (the framework's global step; the next steps count on from
    it); ``samples``/``tokens``: the step's sizes, replacing the sums over its DataLoader
    fetches; ``micro_batches``: its micro-batch count, replacing the number of its fetches (a
    loader that fetches ahead, a batch split into micro-batches). Negative values raise
    ValueError."""
    if _session is not None:
        _session.tracker.step(number, samples, tokens, micro_batches)


@contextlib.contextmanager
def step_scope(name: str = "step") -> Iterator[None]:
    """One step around the block (an inference request, an evaluation batch)."""
    tracker = _session.tracker if _session is not None else None
    if tracker is not None:
        tracker.begin_scope(name)
    try:
        yield
    finally:
        if tracker is not None:
            tracker.end_scope()


def set_batch_size(samples: int | None = None, tokens: int | None = None) -> None:
    """Samples and tokens of the current step, when they cannot be inferred from the batch
    (they replace the sums over the step's DataLoader fetches)."""
    if _session is not None:
        _session.tracker.set_batch(samples, tokens)
