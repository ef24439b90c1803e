"""Composer's ``Callback`` API: mosaicml 0.32.1 (the latest) pins torch<2.7.1, so it is installed
here with ``--no-deps`` into a folder of its own (``pip install --target``), beside the torch
2.13 of this environment, and run as a separate process with that folder on PYTHONPATH; the
CI's environment is left as it is.

What runs for real: Composer's Trainer (``fit`` with micro-batches and an evaluator every 4
batches), its engine and events, our callback, torch 2.13, otelprof exporting to a real OTLP
receiver. What does not: torchvision. Its only wheel for torch 2.13 is the CUDA build, which
cannot load beside the CPU torch (no libc10_cuda.so), and Composer imports it at module level
for image helpers and algorithms a training loop without them never calls: a placeholder
package stands in for it (every name in it raises ImportError when used).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import prereqs
import pytest
from export.receivers import http_receiver
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from integrations import checks

pytestmark = pytest.mark.slow  # the fixture builds Composer's own environment and trains in it

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BATCHES = 12
EVAL_EVERY = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[checks.Captured, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("composer")
    paths = prereqs.composer_paths()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    with http_receiver() as rec:
        env.update(
            PYTHONPATH=os.pathsep.join([*paths, str(ROOT)]),
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{rec.port}",
            OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
            OTEL_EXPORTER_PROMETHEUS_PORT="0",
            OTELPROF_SPOOL_DIR=str(folder / "spool"),
            OTELPROF_PROFILE="false",
        )
        command = [sys.executable, str(HERE / "composer_train.py"), str(BATCHES), str(EVAL_EVERY)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        metrics = {f.name: f for f in text_string_to_metric_families(out.pop("metrics"))}
        resource: dict[str, Any] = {}
        for request in rec.requests:
            for rs in request.resource_spans:
                resource = {kv.key: checks.attrs_value(kv.value) for kv in rs.resource.attributes}
        captured = checks.Captured(rec.spans, metrics, resource)
    assert out["batches"] == BATCHES
    return captured, out


def _truth(out: dict[str, Any]) -> checks.Truth:
    return checks.Truth(
        samples=out["samples"],
        tokens=[None] * len(out["samples"]),  # float features: no tokens
        micro_batches=out["micro_batches"],
        evaluations=out["evaluations"],
        evaluated_after=out["evaluated_after"],
    )


def test_one_step_per_batch_with_its_samples(run: tuple[checks.Captured, dict[str, Any]]) -> None:
    captured, out = run
    assert out["micro_batches"] == [2] * BATCHES  # batch 4, device_train_microbatch_size 2
    checks.check_steps(captured, _truth(out))
    assert captured.resource["otelprof.run.id"] == "composer-run"  # Composer's run name


def test_every_micro_batch_in_its_batch(run: tuple[checks.Captured, dict[str, Any]]) -> None:
    captured, _out = run
    for step in captured.named("train.step"):
        assert [checks.phase_of(p) for p in checks.phase_spans(captured, step)].count("backward") == 2


def test_evaluation_is_its_own_span(run: tuple[checks.Captured, dict[str, Any]]) -> None:
    captured, out = run
    assert out["evaluations"] == BATCHES // EVAL_EVERY
    # its batches' fetches; not its forwards: Composer's eval_forward calls the inner module,
    # a root the forward hooks have not found (they look for new roots every 1000 steps)
    checks.check_evaluations(captured, _truth(out), captured.named("train.step"), phase="data")


def test_phases_inside_their_step_without_overlap(run: tuple[checks.Captured, dict[str, Any]]) -> None:
    captured, _out = run
    checks.check_phases(captured, captured.named("train.step"))


def test_metrics_count_the_training_steps_alone(run: tuple[checks.Captured, dict[str, Any]]) -> None:
    captured, out = run
    assert captured.total("otelprof_steps") == BATCHES
    assert captured.total("otelprof_samples") == sum(out["samples"])


def test_micro_batches_per_step(run: tuple[checks.Captured, dict[str, Any]]) -> None:
    captured, out = run
    checks.check_micro_batches(captured, _truth(out))
