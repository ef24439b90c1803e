"""``otelprof demo``: the main job of the README's first command.

It runs a small CPU training loop (``otelprof._demo_train``, no otelprof code in it) under
``otelprof run``, exactly as a user's job would run, exporting to
``OTEL_EXPORTER_OTLP_ENDPOINT`` when set and to the spool (the embedded default) otherwise,
then prints where the data went and what the instrumentation saw.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .common import int_at_least

DEFAULT_DIR = "otelprof-demo"
SUMMARY = "summary.json"
#: A window early in a short run (a user's own OTELPROF_PROFILE_* settings win): steps 6-8, the
#: schedule's one window, so no separate early window.
DEMO_SCHEDULE = {
    "OTELPROF_PROFILE_EARLY": "0",
    "OTELPROF_PROFILE_SKIP_FIRST": "5",
    "OTELPROF_PROFILE_WAIT": "0",
    "OTELPROF_PROFILE_WARMUP": "1",
    "OTELPROF_PROFILE_ACTIVE": "3",
    "OTELPROF_PROFILE_REPEAT": "1",
}


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    epilog: str,
    add_verbosity: Callable[[argparse.ArgumentParser], None],
) -> None:
    demo = sub.add_parser(
        "demo",
        help="train a small model under `otelprof run` and show where its telemetry went",
        description=(
            "Train a tiny transformer on random tokens on the CPU under `otelprof run`: every\n"
            "step becomes a span and metrics, steps 6-8 are profiled (operator spans). Data goes\n"
            "to OTEL_EXPORTER_OTLP_ENDPOINT when set, else to the spool (`otelprof spool ls`).\n"
            "Writes DIR/summary.json. Needs torch."
        ),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity(demo)
    demo.add_argument(
        "--steps",
        type=int_at_least(9, "the profiled window is steps 6-8"),
        default=20,
        metavar="N",
        help="training steps, at least 9 (default: 20)",
    )
    demo.add_argument(
        "--out", type=Path, default=Path(DEFAULT_DIR), metavar="DIR", help=f"output folder (default: {DEFAULT_DIR})"
    )
    demo.set_defaults(func=_demo)


def demo_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the user's, plus demo defaults where the user set nothing."""
    import uuid

    env = dict(environ)
    defaults = {
        **DEMO_SCHEDULE,
        "OTEL_SERVICE_NAME": "otelprof-demo",
        "OTELPROF_RUN_ID": f"demo-{uuid.uuid4().hex[:8]}",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",  # a free port: never collide with a real job's 9464
        "OTELPROF_QUIET": "true",  # the demo's own summary says where the data went
    }
    for key, value in defaults.items():
        if not env.get(key, "").strip():
            env[key] = value
    return env


def _torch_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def _demo(args: argparse.Namespace) -> int:
    # imported when the demo runs, not when the parser is built (every command line builds it)
    import json
    import subprocess

    if not _torch_installed():
        print("otelprof: error: the demo needs PyTorch, which is not installed: pip install torch", file=sys.stderr)
        return 1
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = out_dir / SUMMARY
    summary_path.unlink(missing_ok=True)
    env = demo_environment(os.environ)
    train = [sys.executable, "-m", "otelprof._demo_train", str(args.steps), str(summary_path)]
    command = [sys.executable, "-m", "otelprof", "run", "--", *train]
    proc = subprocess.run(command, env=env, check=False)
    if proc.returncode != 0 or not summary_path.exists():
        print(f"otelprof: error: the demo training run failed (exit code {proc.returncode})", file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    if not args.quiet:
        _print(summary, args.steps, summary_path)
    return 0 if summary.get("instrumented") else 1


def _print(s: dict[str, Any], steps: int, summary_path: Path) -> None:
    from ..otlp import ids

    if not s.get("instrumented"):
        print("otelprof demo: the training ran but was not instrumented (OTELPROF_ENABLED or OTEL_SDK_DISABLED?)")
        return
    mean = s.get("mean_step_seconds") or 0.0
    print(
        f"otelprof demo: trained a tiny transformer on the CPU under `otelprof run`: {s['steps']} steps "
        f"in {s['train_seconds']:.1f} s (mean step {mean * 1e3:.1f} ms)"
    )
    windows = s.get("windows", {})
    top = windows.get("top_ops", {})
    count = sum(v for k, v in windows.items() if k != "top_ops")
    print(f"  profiling windows: {count}; top operators by self CPU time per profiled step:")
    named = {name: seconds for name, seconds in top.items() if name != "other"}  # "other": the rest summed
    for name, seconds in sorted(named.items(), key=lambda kv: -kv[1])[:5]:
        print(f"    {seconds * 1e3:8.3f} ms  {name}")
    requests = s.get("requests", {})
    if s.get("endpoint"):
        print(f"  sent to {s['endpoint']}: {requests.get('exported', 0)} OTLP requests exported", end="")
        if requests.get("spooled"):
            print(f", {requests['spooled']} spooled (the endpoint did not answer; `otelprof spool replay`)", end="")
        print()
    else:
        print(
            f"  no OTEL_EXPORTER_OTLP_ENDPOINT set: {requests.get('spooled', 0)} OTLP requests kept in the spool "
            f"{s.get('spool_dir')}\n"
            "    list them with `otelprof spool ls`; send them with "
            "`OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 otelprof spool replay`"
        )
    if requests.get("dropped"):
        print(f"  {requests['dropped']} requests dropped (see the warnings above)")
    run_id = s.get("run_id", "")
    profiled = int(DEMO_SCHEDULE["OTELPROF_PROFILE_SKIP_FIRST"]) + int(DEMO_SCHEDULE["OTELPROF_PROFILE_WARMUP"])
    print(f"  run id {run_id}; trace id of step {profiled}: {ids.trace_id(f'step|{run_id}|{profiled}').hex()}")
    print(f"  summary: {summary_path}")
    if steps and s["steps"] != steps:
        print(f"  note: {s['steps']} of {steps} steps recorded")
