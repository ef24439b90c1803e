"""A simulated 1,024-rank job (benchmarks/distributed_scale.py: every rank's step spans, window
spans and metrics made by the real code paths in one process) stays under backend limits, and
each rank exposes the same number of metric series whatever the world size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from converter_helpers import shared_trace

ROOT = Path(__file__).resolve().parents[2]
RANKS = 1024


@pytest.mark.slow
def test_1024_ranks_stay_under_backend_limits() -> None:
    trace = shared_trace("bert-small")  # one profiled step (ProfilerStep#6) per rank
    command = [sys.executable, str(ROOT / "benchmarks" / "distributed_scale.py"), "--ranks", str(RANKS)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([*command, "--trace", str(trace)], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr  # 1: a limit is broken
    result = json.loads(out.stdout.strip().splitlines()[-1])
    anchor, scaled = result["anchor"], result["scaled"]
    assert scaled["ranks"] == RANKS and anchor["ranks"] == 8
    # every step trace: one train.step + 4 phases per rank, plus each rank's window marker at step 6
    assert scaled["max_step_trace_spans"] == 6 * RANKS
    assert scaled["max_step_trace_bytes"] < 5_000_000  # Tempo's max_bytes_per_trace default
    assert scaled["max_trace_bytes"] < 5_000_000 and scaled["max_trace_spans"] < 50_000
    assert scaled["max_request_bytes"] <= 4 * 1024 * 1024  # the Collector's gRPC receive limit
    # operator detail went to one detail trace per rank, not the step trace; each rank's window
    # root is sent too, a span that says what ran outside the step (python functions, folded)
    assert scaled["traces"] == 8 + 2 * RANKS
    assert scaled["unsplit_step_trace_bytes"] > 5_000_000  # what the split avoids
    # metric series per rank: the same at 8 and 1,024 ranks
    assert len(scaled["series_per_rank"]) == 1 and scaled["series_per_rank"] == anchor["series_per_rank"]
    assert scaled["series_total"] == scaled["series_per_rank"][0] * RANKS
    assert scaled["straggler_slowest_rank"] == RANKS // 2 and 1.4 < scaled["straggler_max"] < 1.6
