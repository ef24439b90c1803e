"""OTEL_METRICS_EXPORTER=otlp: a real training process pushes its live metrics through the
OpenTelemetry SDK to a real OTLP receiver (HTTP and gRPC), exemplars carrying step trace ids."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from export.receivers import grpc_receiver, http_receiver
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

from capture import live_session
from otelprof.capture.metrics.otlp_metrics import BRIDGED, DIRECT, exporters, otel_name
from otelprof.capture.metrics.step_metrics import STEP_BUCKETS
from otelprof.otlp import ids

pytest.importorskip("torch")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STEPS = 5


def _metrics(requests: list[Any]) -> dict[str, list[Metric]]:
    out: dict[str, list[Metric]] = {}
    for request in requests:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out.setdefault(metric.name, []).append(metric)
    return out


def _attrs(point: Any) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


@pytest.mark.parametrize("protocol", ["http/protobuf", pytest.param("grpc", marks=pytest.mark.slow)])
def test_live_metrics_arrive_over_otlp_with_exemplars(protocol: str, tmp_path: Path) -> None:
    receiver: AbstractContextManager[Any] = http_receiver() if protocol == "http/protobuf" else grpc_receiver()
    with receiver as rec:
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_METRICS_EXPORTER": "prometheus,otlp",
            "OTEL_METRIC_EXPORT_INTERVAL": "60000",  # only the export at shutdown
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
            "OTELPROF_RUN_ID": "otlp-metrics",
            "OTELPROF_PROFILE": "false",
            "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        script = [sys.executable, str(HERE / "train_loop.py"), str(STEPS), "0", "--auto"]
        out = subprocess.run(script, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    metrics = _metrics(rec.metric_requests)
    labels = {"run": "otlp-metrics", "rank": "0", "local_rank": "0"}

    (duration,) = metrics["otelprof.step.duration"]
    assert duration.unit == "s"
    (point,) = duration.histogram.data_points
    assert point.count == STEPS and _attrs(point) == labels
    trace_ids = {ids.trace_id(f"step|otlp-metrics|{n}") for n in range(STEPS)}
    assert point.exemplars and all(e.trace_id in trace_ids for e in point.exemplars)

    assert list(point.explicit_bounds) == list(STEP_BUCKETS)  # the scrape path's buckets

    (steps,) = metrics["otelprof.steps"]
    assert steps.unit == "{step}"
    assert steps.sum.is_monotonic and [p.as_int for p in steps.sum.data_points] == [STEPS]
    (phases,) = metrics["otelprof.step.phase.duration"]
    assert {_attrs(p)["phase"]: p.count for p in phases.histogram.data_points} == dict.fromkeys(
        ("data", "forward", "backward", "optimizer"), STEPS
    )
    (samples,) = metrics["otelprof.samples"]
    assert samples.sum.data_points[0].as_int == 4 * STEPS
    (batches,) = metrics["otelprof.micro_batches"]  # one DataLoader batch per step
    assert batches.sum.is_monotonic and [p.as_int for p in batches.sum.data_points] == [STEPS]
    (evals,) = metrics["otelprof.eval.forwards"]  # bridged: none in this loop
    assert evals.sum.is_monotonic and [p.as_double for p in evals.sum.data_points] == [0.0]

    # bridged from the prometheus-client registry: the same values under OTel names and units
    (cpu,) = metrics["otelprof.process.cpu"]
    assert cpu.unit == "s" and cpu.sum.is_monotonic and cpu.sum.data_points[0].as_double > 0
    (last,) = metrics["otelprof.last.step.timestamp"]
    assert last.unit == "s" and last.gauge.data_points[0].as_double > 1.7e9
    (requests,) = metrics["otelprof.export.requests"]
    assert requests.unit == "{request}"
    assert {_attrs(p)["result"] for p in requests.sum.data_points} >= {"exported", "dropped"}
    (queue,) = metrics["otelprof.export.queue.requests"]
    assert queue.unit == "{request}" and queue.gauge.data_points[0].as_double >= 0
    # the exporter's latency histogram, bridged whole: the registry's buckets, one attempt or more
    # (the step spans went to this receiver while the process ran)
    (export,) = metrics["otelprof.export.duration"]
    assert export.unit == "s"
    (attempts,) = export.histogram.data_points
    assert attempts.count >= 1 and sum(attempts.bucket_counts) == attempts.count and attempts.sum > 0
    assert list(attempts.explicit_bounds)[:3] == [0.005, 0.01, 0.025]
    assert len(attempts.bucket_counts) == len(attempts.explicit_bounds) + 1
    assert not attempts.HasField("min") and not attempts.HasField("max")  # unknown to Prometheus
    resource = {kv.key: kv.value for kv in rec.metric_requests[0].resource_metrics[0].resource.attributes}
    assert resource["otelprof.run.id"].string_value == "otlp-metrics"


@pytest.mark.slow  # a training subprocess
def test_skipped_updates_reach_the_otlp_push(tmp_path: Path) -> None:
    """A GradScaler loop with 2 updates skipped (inf gradients): the pushed counter says 2."""
    with http_receiver() as rec:
        env = {
            **live_session.both_metric_paths(rec.port),
            "OTELPROF_RUN_ID": "otlp-skips",
            "OTELPROF_PROFILE": "false",
            "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        script = [sys.executable, str(HERE / "scaler_train.py"), str(STEPS), "1,3"]
        out = subprocess.run(script, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "skipped 2" in out.stdout, out.stderr
    metrics = _metrics(rec.metric_requests)
    (skipped,) = metrics[otel_name("otelprof_skipped_updates")[0]]
    assert skipped.sum.is_monotonic and [p.as_double or p.as_int for p in skipped.sum.data_points] == [2]
    (steps,) = metrics["otelprof.steps"]  # a skipped update is still a step
    assert [p.as_int for p in steps.sum.data_points] == [STEPS]


def test_names_map_back_to_the_prometheus_names() -> None:
    """A Collector's Prometheus exporter appends the unit and _total: the dashboards' names
    (the translator's rules applied in tests/stack/test_metric_paths.py)."""
    assert otel_name("otelprof_window_gpu_busy_ratio") == ("otelprof.window.gpu.busy", "1")
    assert otel_name("otelprof_gpu_memory_total_bytes") == ("otelprof.gpu.memory.total", "By")
    assert otel_name("otelprof_export_queue_requests") == ("otelprof.export.queue.requests", "{request}")
    assert otel_name("otelprof_export_duration_seconds") == ("otelprof.export.duration", "s")
    names = [otel_name(name)[0] for name, _, _ in BRIDGED] + [name for name, _ in DIRECT]
    assert len(set(names)) == len(names)  # no instrument name twice
    # "1" only for true ratios: every other unit-less count is an annotation
    assert {unit for _, _, unit in BRIDGED if unit == "1"} == {"1"}
    assert all(family.endswith("_ratio") for family, _, unit in BRIDGED if unit == "1")


def test_exporter_selection(caplog: pytest.LogCaptureFixture) -> None:
    assert exporters({}) == {"prometheus"}
    assert exporters({"OTEL_METRICS_EXPORTER": "otlp"}) == {"otlp"}
    assert exporters({"OTEL_METRICS_EXPORTER": " Prometheus , OTLP "}) == {"prometheus", "otlp"}
    assert exporters({"OTEL_METRICS_EXPORTER": "none"}) == set()
    assert exporters({"OTEL_METRICS_EXPORTER": "console,otlp"}) == {"otlp"}
    assert "console" in caplog.text


def test_bridged_histogram_points_are_the_registrys() -> None:
    """A prometheus-client histogram's cumulative buckets become OTLP per-bucket counts."""
    from prometheus_client import CollectorRegistry, Histogram

    from otelprof.capture.metrics.otlp_metrics import _histogram_points

    registry = CollectorRegistry()
    histogram = Histogram("h_seconds", "h", ["result"], buckets=(0.01, 0.1, 1), registry=registry)
    for value in (0.003, 0.02, 0.05, 40.0):
        histogram.labels(result="ok").observe(value)
    histogram.labels(result="failed").observe(0.5)
    (family,) = [m for m in registry.collect() if m.name == "h_seconds"]
    now = time.time_ns()
    points = {p.attributes["result"]: p for p in _histogram_points(family, now)}
    ok, failed = points["ok"], points["failed"]
    assert list(ok.explicit_bounds) == [0.01, 0.1, 1.0]
    assert list(ok.bucket_counts) == [1, 2, 0, 1] and ok.count == 4 and ok.sum == pytest.approx(40.073)
    assert list(failed.bucket_counts) == [0, 0, 1, 0] and failed.count == 1 and failed.sum == 0.5
    assert ok.time_unix_nano == now and now - 60 * 10**9 < ok.start_time_unix_nano <= now  # from _created
    assert ok.min is None and ok.max is None  # Prometheus keeps neither
