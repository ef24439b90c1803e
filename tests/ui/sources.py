"""What the UI tests send: a live training step (``otelprof demo``, a real CPU training loop
under ``otelprof run`` with a profiling window) and imported GPU traces (``otelprof import`` of
shared Kineto traces), each as a user would run it, configured only by environment variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from converter_helpers import decode
from converter_helpers import shared_trace as shared_trace

from otelprof.converter import ConvertOptions, convert
from otelprof.converter._options import DEFAULT_SPAN_BUDGET
from otelprof.resource import options_from_env
from otelprof.settings.variables import OTELPROF_SPAN_BUDGET

from . import trees

ROOT = Path(__file__).resolve().parents[2]
#: ``otelprof demo`` profiles steps 6-8 (``otelprof.cli.demo.DEMO_SCHEDULE``); 9 is the fewest it takes.
DEMO_STEPS = 9
PROFILED_STEPS = (6, 7, 8)
#: Shared GPU traces imported per test id: H100 BERT inference (kernels, no backward), A100
#: training with NCCL (kernels, fwdbwd flows, three steps of ~1,000 spans each at default detail)
#: and rank 1 of 8-V100 DLRM training, whose step converts to all a person must find in a UI: ops
#: with their kernels, a GPU lane (``gpu 1 · stream 7``: optimizer kernels whose launches are not
#: in the trace) and aggregate spans (five ``aten::record_stream`` as one), in 925 spans.
IMPORTED = {"bert-h100": "bert-small", "nccl-a100": "nccl_data", "dlrm-v100": "dlrm_kineto__worker1"}
#: The import whose GPU step the browser tests open.
GPU_STEP = "dlrm-v100"
TIMEOUT_S = 300


@dataclass(frozen=True)
class Sent:
    """One delivery: the run id its ids derive from, the span budget it ran with, seconds taken."""

    run_id: str
    span_budget: int
    seconds: float
    output: str
    path: Path | None = None  # the Kineto trace imported (None: the live demo)
    summary: dict[str, Any] | None = None  # the demo's summary.json


def span_budget() -> int:
    """The budget the converter applies: ``OTELPROF_SPAN_BUDGET`` when the outer environment
    sets it (it is passed on to the children), else ``ConvertOptions``' default."""
    value = os.environ.get(OTELPROF_SPAN_BUDGET, "").strip()
    budget = int(value) if value.isdigit() else DEFAULT_SPAN_BUDGET
    assert ConvertOptions().span_budget == DEFAULT_SPAN_BUDGET
    return budget


def environ(tmp: Path, run_id: str, **otel: str) -> dict[str, str]:
    """The outer environment without any OTEL_*/OTELPROF_* (the span budget excepted), plus a
    spool of the test's own, the run id and the destination."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    if OTELPROF_SPAN_BUDGET in os.environ:
        env[OTELPROF_SPAN_BUDGET] = os.environ[OTELPROF_SPAN_BUDGET]
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OTELPROF_SPOOL_DIR=str(tmp / "spool"),
        OTELPROF_RUN_ID=run_id,
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        **otel,
    )
    return env


def _run(command: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    out = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL, check=False
    )
    seconds = time.monotonic() - started
    assert out.returncode == 0, (
        f"{' '.join(command)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out, seconds


def live_demo(tmp: Path, run_id: str, **otel: str) -> Sent:
    """``otelprof demo --steps 9``: every step a ``train.step`` span, steps 6-8 profiled, all
    exported over OTLP/HTTP to ``otel``'s endpoint; asserts nothing was spooled or dropped."""
    pytest.importorskip("torch")
    env = environ(tmp, run_id, OTEL_SERVICE_NAME="otelprof-ui-demo", **otel)
    out_dir = tmp / "demo"
    command = [sys.executable, "-m", "otelprof", "demo", "--steps", str(DEMO_STEPS), "--out", str(out_dir)]
    done, seconds = _run(command, env)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["steps"] == DEMO_STEPS and summary["windows"].get("schedule") == 1, summary
    requests = summary["requests"]
    assert requests["exported"] > 0 and requests["spooled"] == requests["dropped"] == 0, summary
    return Sent(run_id, span_budget(), seconds, done.stdout + done.stderr, summary=summary)


def imported(tmp: Path, key: str, run_id: str, **otel: str) -> Sent:
    """``otelprof import`` of one shared trace (``IMPORTED[key]``) at default detail."""
    path = shared_trace(IMPORTED[key])
    env = environ(tmp, run_id, OTEL_SERVICE_NAME="otelprof-ui-import", **otel)
    command = [sys.executable, "-m", "otelprof", "import", "--ledger", str(tmp / f"{key}.ledger.json"), str(path)]
    done, seconds = _run(command, env)
    return Sent(run_id, span_budget(), seconds, done.stdout + done.stderr, path=path)


def converted(path: Path, run_id: str, tmp: Path) -> list[trees.ReadSpan]:
    """What ``otelprof import`` sends for ``path`` under ``run_id``: the trace converted here with
    the options the import takes from the same environment, as :class:`trees.ReadSpan`."""
    result = convert(path, options=options_from_env(environ(tmp, run_id)))
    return [
        trees.ReadSpan(
            s.trace_id.hex(),
            s.span_id.hex(),
            s.parent_id.hex() or None,
            s.name,
            s.attrs,
            tuple(trees.ReadLink(link.trace_id.hex(), link.span_id.hex(), link.attrs) for link in s.links),
        )
        for s in decode(result).spans
    ]
