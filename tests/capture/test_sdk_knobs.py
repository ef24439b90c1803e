"""The OpenTelemetry SDK's knobs (docs/opentelemetry-sdk.md), with the real SDK and a real torch
loop: ``OTEL_TRACES_SAMPLER``/``_ARG`` decide which step and window traces reach a real OTLP
receiver (the SDK's own sampler is the oracle), ``tracer_provider=`` feeds the provider's span
processors the same spans the OTLP path sends, ``OTEL_TRACES_EXPORTER`` names the SDK's console
and Zipkin exporters, and ``meter_provider=`` gets the step metrics."""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from export.receivers import HttpReceiver, http_receiver
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace import sampling as sdk_sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import otelprof
from capture import live_session
from otelprof.export import sampling
from otelprof.otlp import ids

STEPS = 8
PROFILED = (3, 4)  # skip 0-1, warm up 2, record 3-4
WINDOW = live_session.ONE_WINDOW
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


def _sdk(name: str, ratio: float) -> Any:
    """The SDK's own sampler for ``name`` (its configurator's table)."""
    factory: Any = sdk_sampling._KNOWN_SAMPLERS[name]
    return factory(ratio) if "ratio" in name else factory


def _kept(sampler: Any, trace_id: bytes) -> bool:
    return bool(sampler.should_sample(None, int.from_bytes(trace_id, "big"), "train.step").decision.is_sampled())


def _step_trace(run: str, n: int) -> bytes:
    return ids.trace_id(f"step|{run}|{n}")


def _mixed_run_id() -> str:
    """A run id whose profiled steps' traces split at ratio 0.5 (one kept, one dropped), so a
    window's spans are seen to follow their step's decision both ways."""
    ratio = sdk_sampling.TraceIdRatioBased(0.5)
    for i in range(1000):
        run = f"knobs-{i}"
        kept = [_kept(ratio, _step_trace(run, n)) for n in range(STEPS)]
        if kept[PROFILED[0]] != kept[PROFILED[1]] and 2 <= sum(kept) <= STEPS - 2:
            return run
    raise AssertionError("no run id splits the profiled steps")


def _train(steps: int = STEPS) -> None:
    import torch

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 4, 16), torch.randn(steps * 4, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _value(v: Any) -> Any:
    field = v.WhichOneof("value")
    if field == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, field) if field else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


# --- the decision ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    trace_id=st.binary(min_size=16, max_size=16),
    ratio=st.one_of(st.sampled_from([0.0, 1.0, 0.5, 2**-64, 1 - 2**-53]), st.floats(0.0, 1.0)),
    name=st.sampled_from(SAMPLERS),
)
def test_the_fallback_decides_as_the_sdk_samplers(trace_id: bytes, ratio: float, name: str) -> None:
    """The twin: without the SDK, ``sampling.decide`` gives each spec sampler's root decision."""
    assert sampling.decide(sampling.KNOWN[name], ratio, trace_id) == _kept(_sdk(name, ratio), trace_id)


def test_env_samplers_use_the_sdk_classes_and_warn_on_bad_values(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    ratio = sampling.from_env({"OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio", "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    assert isinstance(ratio.sdk, sdk_sampling.ParentBasedTraceIdRatio) and ratio.ratio == 0.25
    assert not caplog.records
    for bad in ("abc", "1.5", "-0.1", "nan"):
        sampler = sampling.from_env({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": bad})
        assert sampler.ratio == 1.0  # the specification's default
        assert sampler.sampled(_step_trace("r", 1))
    assert sum("OTEL_TRACES_SAMPLER_ARG" in r.getMessage() for r in caplog.records) == 4
    caplog.clear()
    remote = sampling.from_env({"OTEL_TRACES_SAMPLER": "jaeger_remote"})
    assert remote.keeps_all
    [record] = caplog.records
    assert "jaeger_remote" in record.getMessage() and "every trace" in record.getMessage()
    assert sampling.from_env({}).keeps_all  # parentbased_always_on


def test_one_decision_per_trace_id_counted_once() -> None:
    registry = CollectorRegistry()
    sampler = sampling.from_env({"OTEL_TRACES_SAMPLER": "always_off"})
    sampler.register(registry)
    trace = _step_trace("r", 7)
    assert not any(sampler.sampled(trace, name) for name in ("train.step", "forward", "ProfilerStep#7"))
    assert not sampler.sampled(_step_trace("r", 8))
    assert registry.get_sample_value("otelprof_traces_sampled_out_total") == 2


def _exemplar_trace_ids(port: int | None) -> set[str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    return {
        sample.exemplar.labels["trace_id"]
        for family in text_string_to_metric_families(text)
        if family.name == "otelprof_step_duration_seconds"
        for sample in family.samples
        if sample.exemplar is not None
    }


def test_the_combination_rules_for_a_provider() -> None:
    """An explicit provider: all its processors; otelprof's OTLP path only when
    OTEL_TRACES_EXPORTER is set, names otlp, and the provider exports no OTLP itself."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from otelprof.export import sdk_route

    sent: list[bytes] = []
    memory = SimpleSpanProcessor(InMemorySpanExporter())
    plain = TracerProvider()
    plain.add_span_processor(memory)
    with_otlp = TracerProvider()
    otlp = BatchSpanProcessor(OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces"))
    with_otlp.add_span_processor(otlp)
    with_otlp.add_span_processor(memory)
    cases = [
        ({}, plain, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, plain, True),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, plain, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, with_otlp, False),
    ]
    for env, provider, sends_otlp in cases:
        route = sdk_route.route(env, sent.append, provider)
        assert (route.otlp is not None) == sends_otlp, env
        assert route.processors == ((memory,) if provider is plain else (otlp, memory))
        assert route.sampler.keeps_all  # the provider's default sampler: no decoding
    silent = sdk_route.route({"OTEL_TRACES_EXPORTER": "none"}, sent.append, plain)
    assert silent.otlp is None and silent.processors == ()
    with_otlp.shutdown()
    assert sdk_route.is_otlp(otlp) and not sdk_route.is_otlp(memory)


# --- the samplers end to end ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("name", "route"), [*((n, "native") for n in SAMPLERS), ("traceidratio", "python")])
def test_each_sampler_decides_which_step_traces_arrive(
    name: str, route: str, receiver: HttpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps whose span arrives are the steps whose trace id the SDK's sampler keeps; a
    profiled step's window spans arrive with its step or not at all; every span that arrives is
    in a kept trace (the window's own traces decided by their own ids). ``python``: the step
    route without the native core (the reference encoder's requests)."""
    pytest.importorskip("torch")
    if route == "python":
        from otelprof.capture import session as session_module
        from otelprof.capture.steps.native_tracker import step_tracker

        monkeypatch.setattr(session_module, "step_tracker", functools.partial(step_tracker, native=False))
    run = _mixed_run_id()
    env = {**WINDOW, "OTELPROF_RUN_ID": run, "OTEL_TRACES_SAMPLER": name, "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    session = live_session.start(receiver.port, tmp_path, **env)
    _train()
    assert session.route is not None
    sampler = session.route.sampler
    exemplars = _exemplar_trace_ids(session.metrics_port)
    assert (session._sink is None) == (route == "python")
    live_session.stop(session)

    oracle = _sdk(name, 0.5)
    expected = {n for n in range(STEPS) if _kept(oracle, _step_trace(run, n))}
    spans = receiver.spans
    numbers = {_step_trace(run, n): n for n in range(STEPS)}
    assert {numbers[s.trace_id] for s in spans if s.name == "train.step"} == expected
    assert all(_kept(oracle, s.trace_id) for s in spans)
    # /metrics' exemplars link only to steps that were sent
    assert exemplars <= {_step_trace(run, n).hex() for n in expected} and bool(exemplars) == bool(expected)
    for n in PROFILED:
        markers = [s for s in spans if s.name == f"ProfilerStep#{n}"]
        assert [m.trace_id for m in markers] == ([_step_trace(run, n)] if n in expected else [])
    if name in ("always_on", "parentbased_always_on"):  # the fast path: nothing decoded
        assert sampler.keeps_all and sampler.sampled_out == 0
    else:  # each dropped trace counted once: the steps', and the windows' own traces
        assert not sampler.keeps_all and sampler.sampled_out >= STEPS - len(expected)


# --- tracer_provider / meter_provider -------------------------------------------------------


@pytest.mark.slow
def test_tracer_provider_gets_the_spans_the_otlp_path_sends(
    receiver: HttpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TorchInstrumentor().instrument(tracer_provider=P, meter_provider=M)``: P's in-memory
    exporter gets every span the OTLP receiver gets (OTEL_TRACES_EXPORTER=otlp asks for both,
    and P exports no OTLP), equal in ids, parents, names, times, attributes, events, links and
    resource; P's sampler decides for both; M's reader gets the step metrics."""
    pytest.importorskip("torch")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otelprof.instrumentor import TorchInstrumentor

    run = _mixed_run_id()
    env = {
        **WINDOW,
        "OTELPROF_RUN_ID": run,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
        "OTELPROF_TRACE_DIR": str(tmp_path / "traces"),
        "OTEL_SERVICE_NAME": "knobs",
    }
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    memory = InMemorySpanExporter()
    provider = TracerProvider(sampler=sdk_sampling.TraceIdRatioBased(0.5))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    instrumentor = TorchInstrumentor()
    instrumentor.instrument(tracer_provider=provider, meter_provider=meters, registry=CollectorRegistry())
    try:
        session = otelprof.instrumentation.session()
        assert session is not None
        _train()  # every step closes inside the loop (the fetch that ends the epoch)
        metrics = reader.get_metrics_data()  # before uninstrument()'s flush collects the exemplars
    finally:
        instrumentor.uninstrument()
    assert session.exporter is not None
    otlp = {
        s.span_id: (rs, s)
        for r in receiver.requests
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }
    sdk = {s.context.span_id.to_bytes(8, "big"): s for s in memory.get_finished_spans()}
    assert sdk.keys() == otlp.keys() and len(sdk) > 5 * STEPS
    steps = sorted((s for s in sdk.values() if s.name == "train.step"), key=lambda s: s.start_time or 0)
    expected = [n for n in range(STEPS) if _kept(provider.sampler, _step_trace(run, n))]
    assert [s.context.trace_id.to_bytes(16, "big") for s in steps] == [_step_trace(run, n) for n in expected]
    links = 0
    for span_id, span in sdk.items():
        resource_spans, pb = otlp[span_id]
        assert span.name == pb.name
        assert span.context.trace_id.to_bytes(16, "big") == pb.trace_id
        assert (span.parent.span_id.to_bytes(8, "big") if span.parent else b"") == pb.parent_span_id
        assert (span.start_time, span.end_time) == (pb.start_time_unix_nano, pb.end_time_unix_nano)
        assert dict(span.attributes or {}) == _attrs(pb.attributes)
        assert dict(span.resource.attributes) == _attrs(resource_spans.resource.attributes)
        assert [(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events] == [
            (e.name, e.time_unix_nano, _attrs(e.attributes)) for e in pb.events
        ]
        assert [(k.context.span_id.to_bytes(8, "big"), dict(k.attributes or {})) for k in span.links] == [
            (k.span_id, _attrs(k.attributes)) for k in pb.links
        ]
        links += len(span.links)
    assert span.resource.attributes["service.name"] == "knobs"
    # phases hang under their step
    for step in steps:
        phases = [s for s in sdk.values() if s.parent is not None and s.parent.span_id == step.context.span_id]
        assert step.attributes is not None and step.attributes["otelprof.step.source"] == "live"
        assert len(phases) >= 4 and all(p.context.trace_id == step.context.trace_id for p in phases)
    assert metrics is not None
    points: dict[str, Any] = {
        m.name: m.data.data_points for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert [p.count for p in points["otelprof.step.duration"]] == [STEPS]
    assert [p.value for p in points["otelprof.steps"]] == [STEPS]
    exemplars = [e.trace_id for p in points["otelprof.step.duration"] for e in p.exemplars]
    # no exemplar links to a trace that was not sent
    assert exemplars and all(_kept(provider.sampler, t.to_bytes(16, "big")) for t in exemplars)


# --- OTEL_TRACES_EXPORTER: the SDK's exporters ----------------------------------------------

_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    if os.environ.get("GLOBAL_CONSOLE"):  # an application that configured the SDK itself
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        trace.set_tracer_provider(provider)
    import otelprof
    from capture.test_sdk_knobs import _train
    otelprof.instrument()
    _train(4)
    """
)


def _console_spans(stdout: str) -> list[dict[str, Any]]:
    """ConsoleSpanExporter's output: one indented JSON object per span."""
    decoder, i = json.JSONDecoder(), 0
    out: list[dict[str, Any]] = []
    while True:
        i = stdout.find("{", i)
        if i < 0:
            return out
        span, i = decoder.raw_decode(stdout, i)
        out.append(span)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["env_console", "app_console"])
def test_console_exporter_prints_the_step_spans(case: str, receiver: HttpReceiver, tmp_path: Path) -> None:
    """``OTEL_TRACES_EXPORTER=console`` alone: the SDK's console exporter prints the spans and
    otelprof sends no OTLP. An application's own SDK provider with a console processor (no
    OTEL_TRACES_EXPORTER): console too, and otelprof's OTLP path as before."""
    pytest.importorskip("torch")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "OTELPROF"))},
        "OTELPROF_RUN_ID": "console",
        "OTELPROF_PROFILE_EARLY": "0",
        "OTELPROF_ANOMALY_FACTOR": "0",
        "OTELPROF_TRIGGER_SIGNAL": "none",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
        "OTELPROF_QUIET": "true",
    }
    if case == "env_console":
        env["OTEL_TRACES_EXPORTER"] = "console"
    else:
        env["GLOBAL_CONSOLE"] = "1"
    script = _SCRIPT.format(tests=str(Path(__file__).parents[1]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    printed = _console_spans(proc.stdout)
    steps = [s for s in printed if s["name"] == "train.step"]
    assert [s["context"]["trace_id"] for s in steps] == [f"0x{_step_trace('console', n).hex()}" for n in range(4)]
    phases = [s for s in printed if s["parent_id"] in {st["context"]["span_id"] for st in steps}]
    assert len(phases) == 4 * 4
    assert all(s["attributes"]["otelprof.step.source"] == "live" for s in steps)
    otlp_steps = [s for s in receiver.spans if s.name == "train.step"]
    assert len(otlp_steps) == (0 if case == "env_console" else 4)


class _Zipkin(BaseHTTPRequestHandler):
    spans: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).spans.extend(json.loads(body))
        self.send_response(202)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.mark.slow
def test_a_zipkin_exporter_gets_the_spans(
    receiver: HttpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OTEL_TRACES_EXPORTER=zipkin_json,otlp``: the SDK's Zipkin exporter, built from its entry
    point, posts Zipkin v2 JSON to a loopback receiver (names, trace ids, parent ids as the OTLP
    path has them) and otelprof's OTLP path sends the same spans."""
    pytest.importorskip("torch")
    _Zipkin.spans = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Zipkin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("OTEL_EXPORTER_ZIPKIN_ENDPOINT", f"http://127.0.0.1:{server.server_port}/api/v2/spans")
    try:
        session = live_session.start(
            receiver.port,
            tmp_path,
            OTELPROF_RUN_ID="zipkin",
            OTELPROF_PROFILE_EARLY="0",
            OTELPROF_ANOMALY_FACTOR="0",
            OTELPROF_TRIGGER_SIGNAL="none",
            OTEL_SERVICE_NAME="zipkin-trainer",
            OTEL_TRACES_EXPORTER="zipkin_json,otlp",
        )
        _train(4)
        live_session.stop(session)  # shuts the route's BatchSpanProcessor down: all posted
    finally:
        server.shutdown()
        server.server_close()
    zipkin = {s["id"]: s for s in _Zipkin.spans}
    otlp = {s.span_id.hex(): s for s in receiver.spans}
    assert zipkin.keys() == otlp.keys() and len(zipkin) == 4 * 5
    for span_id, z in zipkin.items():
        pb = otlp[span_id]
        assert z["name"] == pb.name and z["traceId"] == pb.trace_id.hex()
        assert z.get("parentId", "") == pb.parent_span_id.hex()
        assert z["timestamp"] == (pb.start_time_unix_nano + 500) // 1000  # Zipkin rounds to us
        assert z["localEndpoint"]["serviceName"] == "zipkin-trainer"
    steps = sorted((z for z in zipkin.values() if z["name"] == "train.step"), key=lambda z: z["timestamp"])
    assert [z["traceId"] for z in steps] == [_step_trace("zipkin", n).hex() for n in range(4)]
    assert all("parentId" not in z for z in steps)


@pytest.mark.slow
def test_the_benchmark_runs() -> None:
    """benchmarks/sdk_route.py works (its figures are read by people, never asserted)."""
    script = Path(__file__).parents[2] / "benchmarks" / "sdk_route.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--steps", "50", "--rounds", "1"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["steps_sdk_us_per_span"] > 0 and figures["window_sdk_over_fast"] > 0
