"""otelprof's per-step cost on each live step route, on the CPU, interleaved:

    python benchmarks/step_route.py [--rounds N] [--steps N]

- ``native``: the default CPU-timed step (the native tracker folding the step into its sink);
- ``cuda``: the route CUDA-timed steps take (held in the native sink until their events
  complete), forced on the CPU: the session's device timing runs over stand-in events
  (recorded at the tracker's timestamps, always complete, durations from the CPU clock), so
  everything but the CUDA calls themselves is paid;
- ``otlp``: ``OTEL_METRICS_EXPORTER=prometheus,otlp`` (histograms recorded per step through
  the SDK; the export interval is long, so no export runs inside the measurement).

Each round runs the bare tiny loop (benchmarks/overhead.py's) and every route once, in balanced
orders (each side as often straight after each other side: benchmarks/orders.py); the figure
per route is the median over rounds of its difference to the bare run of the same round, in
microseconds per step.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from prometheus_client import CollectorRegistry

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import otelprof
from benchmarks.orders import balanced_orders
from benchmarks.overhead import make_loop
from otelprof.capture import session as session_module
from otelprof.capture.steps.device_timing import CpuEvent, DeviceTiming


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """The session times steps with CPU-clock stand-ins for CUDA events (the CUDA route)."""

    def timing(emit: Any) -> DeviceTiming:
        return DeviceTiming(emit, CpuEvent, lambda: True)

    with mock.patch.object(session_module, "cuda_timing", timing):
        yield


def routed(run: Callable[[], float], env: dict[str, str], cuda: bool = False) -> Callable[[], float]:
    def once() -> float:
        with fake_cuda() if cuda else contextlib.nullcontext():
            session = otelprof.instrument(environ=env, registry=CollectorRegistry())
        if session is None:
            raise RuntimeError("otelprof did not instrument")
        try:
            return run()
        finally:
            otelprof.uninstrument()

    return once


class _Accept(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that takes everything (so no export retries, in or out of runs)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=200, help="steps per run (at least 2)")
    parser.add_argument("--json", help="also write each side's seconds per step, per round, to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # no export mid-run
    run = make_loop(args.steps, tiny=True)
    run()  # warm-up
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{receiver.server_port}"
    os.environ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = endpoint + "/v1/metrics"
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTELPROF_SPOOL_DIR": os.path.join(tmp, "spool"),
            "OTELPROF_RUN_ID": "step-route",
            "OTELPROF_PROFILE": "false",
        }
        sides: dict[str, Callable[[], float]] = {
            "bare": run,
            "native": routed(run, env),
            "cuda": routed(run, env, cuda=True),
            "otlp": routed(run, {**env, "OTEL_METRICS_EXPORTER": "prometheus,otlp"}),
        }
        names = list(sides)
        orders = balanced_orders(names)
        times: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            for name in orders[round_ % len(orders)]:
                gc.collect()
                times[name].append(sides[name]())
    if args.json:
        with open(args.json, "w") as out:
            json.dump(times, out)
    bare = times["bare"]
    print(f"bare   : {statistics.median(bare) * 1e6:.1f} us/step (median of {args.rounds} runs of {args.steps} steps)")
    for name in names[1:]:
        diffs = [y - x for x, y in zip(bare, times[name], strict=True)]
        error = 1.2533 * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        print(f"{name:7}: +{statistics.median(diffs) * 1e6:.1f} +- {error * 1e6:.1f} us/step over bare")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
