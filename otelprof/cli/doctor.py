"""``otelprof doctor``: the effective configuration, then one ok/warn/fail line per check."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._version import __version__
from .common import EXIT_ERROR, EXIT_OK

if TYPE_CHECKING:  # the checks (grpc, prometheus-client, the settings tables) load when the command runs
    from ..report.doctor import Check, Setting

_LABEL = {"ok": "[ ok ]", "warn": "[warn]", "fail": "[FAIL]", "skip": "[skip]"}


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 600 seconds, not {text}")
    return value


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    epilog: str,
    add_verbosity: Callable[[argparse.ArgumentParser], None],
) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check the configuration, the OTLP endpoint, the metrics port, torch/CUDA and the spool",
        description=(
            "Print the effective configuration (every OTEL_* and OTELPROF_* variable otelprof reads,\n"
            "its value or default; header values and URL credentials masked), then one line per\n"
            "check: the variables' values, a real empty Export call to the OTLP endpoint (reachability,\n"
            "TLS, credentials) over the configured protocol, the Prometheus /metrics port, the native\n"
            "core, torch / CUDA / CUPTI, and the spool. warn lines do not fail the command unless --strict."
        ),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity(doctor)
    doctor.add_argument("--format", choices=("text", "json"), default="text", help="default: text")
    doctor.add_argument(
        "--timeout",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="longest wait for the endpoint, seconds (default: 5, or OTEL_EXPORTER_OTLP_TIMEOUT when shorter)",
    )
    doctor.add_argument("--no-torch", action="store_true", help="skip the torch / CUDA / CUPTI checks")
    doctor.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    doctor.set_defaults(func=_doctor)


def _setting_line(s: Setting) -> str:
    if s.value is not None:
        return f"  {s.name}={s.value}"
    return f"  {s.name} unset" + (f" (default: {s.default})" if s.default else "")


def _doctor(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from ..report.doctor import FAIL, WARN, run_checks, settings

    environ = dict(os.environ)
    config = settings(environ)
    checks = run_checks(environ, timeout_s=args.timeout, torch=not args.no_torch)
    failed = any(c.status == FAIL or (args.strict and c.status == WARN) for c in checks)
    if args.format == "json":
        doc = {
            "ok": not failed,
            "version": __version__,
            "configuration": [asdict(s) for s in config],
            "checks": [asdict(c) for c in checks],
        }
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return EXIT_ERROR if failed else EXIT_OK
    if not args.quiet:
        print(f"otelprof {__version__} doctor")
        print("configuration:")
        # the TRACES_ forms only matter when set: unset, the general variable applies
        for s in config:
            if s.value is not None or "_TRACES_" not in s.name:
                print(_setting_line(s))
        print("checks:")
    for check in checks:
        if not args.quiet or check.status == FAIL or (args.strict and check.status == WARN):
            print(_line(check))
    return EXIT_ERROR if failed else EXIT_OK


def _line(check: Check) -> str:
    return f"{_LABEL[check.status]} {check.name}: {check.message}"
