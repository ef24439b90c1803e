"""The end of a run with ``OTEL_METRICS_EXPORTER=prometheus,otlp``: a real training process
that exits without uninstrumenting pushes its last step (and its last evaluation forwards) over
OTLP/gRPC to a real receiver on loopback, and the SDK says nothing on stderr. The SDK's own
exit handler used to run before otelprof closed the last step: the pushed metrics missed it,
and otelprof's shutdown then made the SDK warn "shutdown can only be called once"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from export.receivers import grpc_receiver

from otelprof.otlp import ids

pytest.importorskip("torch")
pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc.metric_exporter")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
UPDATES = 6
EVAL_FORWARDS = 9


def _last(requests: list[Any], name: str) -> Any:
    """The last exported state of metric ``name`` (cumulative: the latest export holds it all)."""
    found = [m for r in requests for rm in r.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    metrics = [m for m in found if m.name == name]
    assert metrics, f"{name} was never exported"
    return metrics[-1]


def _run(tmp_path: Path, eval_forwards: int) -> tuple[Any, dict[str, Any], str]:
    with grpc_receiver() as rec:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{rec.port}",
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_METRICS_EXPORTER="prometheus,otlp",
            OTEL_METRIC_EXPORT_INTERVAL="60000",  # only the export at the end
            OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
            OTEL_EXPORTER_PROMETHEUS_PORT="0",
            OTELPROF_RUN_ID="otlp-exit",
            OTELPROF_PROFILE="false",
            OTELPROF_SPOOL_DIR=str(tmp_path / "spool"),
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        )
        script = [sys.executable, str(HERE / "otlp_exit_train.py"), str(UPDATES), str(eval_forwards)]
        done = subprocess.run(script, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-4000:]
    return rec, json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.slow  # a training subprocess
@pytest.mark.parametrize("eval_forwards", [0, EVAL_FORWARDS], ids=["last-step-open", "evaluation-after"])
def test_the_last_step_reaches_the_otlp_metrics(tmp_path: Path, eval_forwards: int) -> None:
    rec, truth, stderr = _run(tmp_path, eval_forwards)
    assert "shutdown can only be called once" not in stderr
    assert "Traceback" not in stderr, stderr[-4000:]
    requests = rec.metric_requests

    steps = _last(requests, "otelprof.steps")
    assert [p.as_int for p in steps.sum.data_points] == [truth["updates"]]
    samples = _last(requests, "otelprof.samples")
    assert [p.as_int for p in samples.sum.data_points] == [truth["samples"]]
    (duration,) = _last(requests, "otelprof.step.duration").histogram.data_points
    assert duration.count == truth["updates"]
    trace_ids = {ids.trace_id(f"step|otlp-exit|{n}") for n in range(truth["updates"])}
    assert duration.exemplars and {e.trace_id for e in duration.exemplars} <= trace_ids
    # bridged from the registry at the final export: the last step's time, every eval forward
    (last,) = _last(requests, "otelprof.last.step.timestamp").gauge.data_points
    assert last.as_double >= truth["last_update"]
    (evals,) = _last(requests, "otelprof.eval.forwards").sum.data_points
    assert evals.as_double == eval_forwards

    # and the step spans, the last one included
    spans = [s for r in rec.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    steps_seen = sorted(
        kv.value.int_value
        for span in spans
        if span.name == "train.step"
        for kv in span.attributes
        if kv.key == "otelprof.step.number"
    )
    assert steps_seen == list(range(truth["updates"]))
