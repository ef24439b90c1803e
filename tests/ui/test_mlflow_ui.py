"""The span trees MLflow's trace UI shows, for a live training step and imported GPU traces.

A real ``mlflow server`` (the session's, ``tests/conftest.py``) receives, each in its own
experiment, over OTLP/HTTP and configured only by ``OTEL_EXPORTER_OTLP_TRACES_*``:

- ``live-demo``: ``otelprof demo --steps 9`` (a real CPU training loop under ``otelprof run``,
  steps 6-8 profiled);
- ``bert-h100``, ``nccl-a100``, ``dlrm-v100``: ``otelprof import`` of shared GPU traces.

Everything is read back with MLflow's client and held to ``tests/ui/trees.py``'s rules (one
root per trace, kernels under CPU ops or GPU lanes, no device span under a root, fwdbwd links
between named ops, spans per trace within the span budget, lanes and aggregates intact). The
last tests open, in MLflow's trace view in Debian's chromium (playwright, ``executable_path``),
the profiled live step (its span tree drawn) and the DLRM GPU step, where an op with a kernel
under it, a GPU lane and an aggregate span are found from the page (``tests/ui/gpu_step.py``);
each saves screenshots.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from export.mlflow_server import MlflowServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof.converter import convert
from otelprof.resource import options_from_env

from . import gpu_step, outline, sources, trees
from .browser import chromium, screenshot_dir

pytest.importorskip("mlflow", reason="mlflow is not installed (it is in the 'test' extra: pip install -e '.[test]')")

from mlflow import MlflowClient
from mlflow.entities import Span

HEADER = "x-mlflow-experiment-id"
#: Bounds the trace view's render (page load, the trace fetched, the span tree drawn).
RENDER_TIMEOUT_S = 60.0
#: The step the browser opens: the middle of the demo's profiled window.
OPENED_STEP = 7


@dataclass(frozen=True)
class ReadBack:
    experiment_id: str
    sent: sources.Sent
    spans: list[trees.ReadSpan]
    seconds: float  # reading back

    def trace_of_step(self, step: int) -> str:
        """The trace id (hex) holding ``ProfilerStep#<step>``."""
        (trace_id,) = {s.trace_id for s in self.spans if s.name == f"ProfilerStep#{step}"}
        return trace_id


def _hex(mlflow_trace_id: str) -> str:
    return mlflow_trace_id.removeprefix("tr-")


def _read_span(span: Span) -> trees.ReadSpan:
    attributes = {k: v for k, v in span.attributes.items() if not k.startswith("mlflow.")}
    links = tuple(trees.ReadLink(_hex(link.trace_id), link.span_id, link.attributes or {}) for link in span.links)
    return trees.ReadSpan(_hex(span.trace_id), span.span_id, span.parent_id, span.name, attributes, links)


def _read_back(client: MlflowClient, experiment_id: str) -> tuple[list[trees.ReadSpan], float]:
    started = time.monotonic()
    spans, token = [], None
    while True:
        page = client.search_traces(locations=[experiment_id], max_results=100, page_token=token)
        spans += [_read_span(span) for trace in page for span in trace.data.spans]
        token = page.token
        if token is None:
            return spans, time.monotonic() - started


def _otel(server: MlflowServer, experiment_id: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": server.traces_url,
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"{HEADER}={experiment_id}",
    }


@pytest.fixture(scope="module")
def client(mlflow_server: MlflowServer) -> MlflowClient:
    return MlflowClient(tracking_uri=mlflow_server.url)


@pytest.fixture(scope="module")
def live_demo(mlflow_server: MlflowServer, client: MlflowClient, tmp_path_factory: pytest.TempPathFactory) -> ReadBack:
    experiment_id = client.create_experiment("otelprof-ui-live-demo")
    sent = sources.live_demo(tmp_path_factory.mktemp("ui-demo"), "ui-live-demo", **_otel(mlflow_server, experiment_id))
    spans, seconds = _read_back(client, experiment_id)
    return ReadBack(experiment_id, sent, spans, seconds)


@pytest.fixture(scope="module")
def imports(
    mlflow_server: MlflowServer, client: MlflowClient, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], ReadBack]:
    """``imports(key)``: the shared trace ``sources.IMPORTED[key]`` imported into an experiment of
    its own (once per module) and read back."""
    done: dict[str, ReadBack] = {}

    def get(key: str) -> ReadBack:
        if key not in done:
            experiment_id = client.create_experiment(f"otelprof-ui-{key}")
            tmp = tmp_path_factory.mktemp(f"ui-{key}")
            sent = sources.imported(tmp, key, f"ui-{key}", **_otel(mlflow_server, experiment_id))
            spans, seconds = _read_back(client, experiment_id)
            done[key] = ReadBack(experiment_id, sent, spans, seconds)
        return done[key]

    return get


@pytest.fixture(params=["live-demo", *sources.IMPORTED])
def delivery(request: pytest.FixtureRequest) -> ReadBack:
    if request.param == "live-demo":
        result: ReadBack = request.getfixturevalue("live_demo")
    else:
        result = request.getfixturevalue("imports")(request.param)
    print(
        f"\n{request.param}: sent in {result.sent.seconds:.1f} s, read back in {result.seconds:.1f} s\n"
        + trees.summary(result.spans)
    )
    return result


# --- what arrived --------------------------------------------------------------------------


@pytest.mark.slow
def test_the_live_step_arrives_with_its_profiled_operators(live_demo: ReadBack) -> None:
    """Every step is a ``train.step`` trace; the profiled ones hold ``ProfilerStep#N`` and
    operators, under the step's live span (one tree per step)."""
    traces = trees.by_trace(live_demo.spans)
    roots = sorted(trees.root_name(trace) for trace in traces.values())
    assert roots.count("train.step") == sources.DEMO_STEPS, roots
    for step in sources.PROFILED_STEPS:
        trace = traces[live_demo.trace_of_step(step)]
        names = {s.name for s in trace.values()}
        assert trees.root_name(trace) == "train.step"
        assert {"aten::linear", "aten::mm"} <= names, sorted(names)[:40]


@pytest.mark.slow
@pytest.mark.parametrize("key", list(sources.IMPORTED))
def test_an_imported_trace_arrives_whole(imports: Callable[[str], ReadBack], key: str, tmp_path: Path) -> None:
    """Every span the import converted is read back, so the tree checks below see all of it."""
    read = imports(key)
    assert read.sent.path is not None
    result = convert(read.sent.path, options=options_from_env(sources.environ(tmp_path, read.sent.run_id)))
    sent = {
        (span.trace_id.hex(), span.span_id.hex())
        for raw in result.requests
        for rs in ExportTraceServiceRequest.FromString(raw).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    }
    assert {(s.trace_id, s.span_id) for s in read.spans} == sent
    assert any(trees.is_kernel(s) for s in read.spans)


# --- the tree rules (tests/ui/trees.py) ----------------------------------------------------


@pytest.mark.slow
def test_one_root_per_step_trace(delivery: ReadBack) -> None:
    trees.require(trees.one_root_per_trace(delivery.spans))


@pytest.mark.slow
def test_kernels_hang_under_cpu_ops_or_lanes(delivery: ReadBack) -> None:
    exempt = trees.launches_without_enclosing_op(delivery.sent.path) if delivery.sent.path else frozenset()
    trees.require(trees.kernels_under_ops(delivery.spans, exempt))


@pytest.mark.slow
def test_no_device_span_under_a_root_and_lanes_under_roots(delivery: ReadBack) -> None:
    trees.require(trees.device_work_and_lanes(delivery.spans))


@pytest.mark.slow
@pytest.mark.parametrize("key", list(sources.IMPORTED))
def test_lanes_and_aggregates_arrive_intact(imports: Callable[[str], ReadBack], key: str, tmp_path: Path) -> None:
    """Every lane and aggregate span sent is read back from MLflow's store with its name, parent
    and attributes (``otelprof.aggregated_*``, the lane's device and stream), types kept."""
    read = imports(key)
    assert read.sent.path is not None
    sent = sources.converted(read.sent.path, read.sent.run_id, tmp_path)
    report = trees.rollups_arrive_intact(read.spans, sent)
    trees.require(report)
    assert report.looked_at > 0, trees.summary(sent)
    if key == sources.GPU_STEP:
        assert any(map(trees.is_lane, sent)) and any(map(trees.is_aggregate, sent)), trees.summary(sent)


@pytest.mark.slow
def test_fwdbwd_links_join_named_ops(delivery: ReadBack) -> None:
    trees.require(trees.fwdbwd_links_join_ops(delivery.spans))


@pytest.mark.slow
def test_spans_per_trace_within_the_budget(delivery: ReadBack) -> None:
    trees.require(trees.spans_within_budget(delivery.spans, delivery.sent.span_budget))


# --- the browser ---------------------------------------------------------------------------


@pytest.mark.slow
def test_the_profiled_step_renders_in_mlflows_trace_view(
    mlflow_server: MlflowServer, live_demo: ReadBack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the 'test' extra)")
    trace_id = "tr-" + live_demo.trace_of_step(OPENED_STEP)
    url = (
        f"{mlflow_server.url}/#/experiments/{live_demo.experiment_id}/traces"
        f"?selectedEvaluationId={trace_id}&traceId={trace_id}"
    )
    shot = tmp_path / "mlflow-step.png"
    started = time.monotonic()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url, timeout=RENDER_TIMEOUT_S * 1000)
            step = page.get_by_text(f"ProfilerStep#{OPENED_STEP}", exact=True).first
            step.wait_for(state="visible", timeout=RENDER_TIMEOUT_S * 1000)
            root = page.get_by_text("train.step", exact=True).first
            root.wait_for(state="visible", timeout=RENDER_TIMEOUT_S * 1000)
            rendered_s = time.monotonic() - started
            page.screenshot(path=str(shot), full_page=False)
            text = page.inner_text("body")
        finally:
            browser.close()
    assert f"ProfilerStep#{OPENED_STEP}" in text and "train.step" in text
    assert "aten::linear" in text  # operators drawn in the tree, not only the step
    kept = screenshot_dir() / "mlflow-step.png"
    shutil.copyfile(shot, kept)
    line = f"MLflow trace view of step {OPENED_STEP} rendered in {rendered_s:.1f} s; screenshot: {kept}"
    with capsys.disabled():  # shown in a passing run too, not only with -s or -rP
        print(f"\n{line}")


@pytest.mark.slow
def test_a_gpu_step_shows_an_op_with_its_kernels_a_lane_and_an_aggregate(
    mlflow_server: MlflowServer,
    imports: Callable[[str], ReadBack],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """MLflow's trace view of the DLRM GPU step draws every span under the parent it was sent
    under, and a person finds there an op with a kernel under it, the ``gpu 1 · stream 7`` lane
    and an aggregate span, each confirmed by the details pane (``tests/ui/gpu_step.py``)."""
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the 'test' extra)")
    read = imports(sources.GPU_STEP)
    assert read.sent.path is not None
    step = gpu_step.expected(sources.converted(read.sent.path, read.sent.run_id, tmp_path))
    trace_id = f"tr-{step.trace_id}"
    url = (
        f"{mlflow_server.url}/#/experiments/{read.experiment_id}/traces"
        f"?selectedEvaluationId={trace_id}&traceId={trace_id}"
    )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            started = time.monotonic()
            page.goto(url, timeout=RENDER_TIMEOUT_S * 1000)
            walked = gpu_step.walk(page, outline.MLFLOW, step, tmp_path, started)
        finally:
            browser.close()
    kept = [screenshot_dir() / shot.name for shot in walked.screenshots]
    for shot, copy in zip(walked.screenshots, kept, strict=True):
        shutil.copyfile(shot, copy)
    with capsys.disabled():  # shown in a passing run too
        print(
            f"\nMLflow drew the GPU step {step.root.name} in {walked.drawn_s:.1f} s: {len(walked.rows)} rows, "
            f"{walked.expanded} shown closed, {walked.reopened} closed and reopened by the test; "
            f"found {walked.found}; screenshots: {', '.join(map(str, kept))}"
        )
