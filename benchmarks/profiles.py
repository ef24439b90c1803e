"""What a with_stack window's flame graphs cost (issue 37), interleaved (ABBA) as overhead.py's
window part, on its training loop:

    python benchmarks/profiles.py [--rounds N] [--window-steps N]

1. The loop under bare ``torch.profiler(with_stack=True)`` (warmup 1, active N, trace saved)
   against otelprof's window with ``OTELPROF_PROFILE_OPTIONS=with_stack``: converted, exported,
   and its stacks made into an OTLP profile, pprof and collapsed stacks on the conversion thread.
   Both go on for as many steps again after the window, so the background work is paid inside
   the measured time.
2. otelprof's window with profiles sent against the same with ``OTELPROF_PROFILES_EXPORT=false``
   (no trace kept on either side, so no files): the stacks pass and the profile's own share.
3. The stacks pass alone (capture/profiles/stacks.py: the converter's reader and key_averages
   tree over the saved JSON, native where the module loads), per window, and on the shared
   traces with Python stacks by both twins (the Python reference and ``_native.stack_samples``).
4. The encoding alone (capture/profiles/encode.py's OTLP request and pprof, stacks.collapsed),
   which holds the GIL: on the bare side's saved window and three shared traces, against the
   row-by-row encoders it replaced (tests/capture/test_profiles_encode.py's ``ref_*``, the same
   bytes). ``--reference-encoders`` runs the whole benchmark with those instead (the "before").
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import Side, instrumented, interleaved, make_loop  # type: ignore[import-not-found]

import otelprof
from otelprof.capture.profiles import stacks
from otelprof.converter import LiveStep, native_available

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "kineto"
TESTS = Path(__file__).resolve().parents[1] / "tests"
#: the shared traces the encoding is timed on: two with Python stacks, the largest one
ENCODE_TRACES = (
    ("h100__gaunernst_bert", "bert_h100"),
    ("mi300__ddp_resnet18", "resnet18_mi300"),
    ("df_index", "largest"),
)


def reference_encoders() -> Any:
    """The encoders as they were (the tests' reference)."""
    sys.path[:0] = [str(TESTS), str(TESTS / "capture")]
    import test_profiles_encode  # type: ignore[import-not-found]

    return test_profiles_encode


def encode_times(found: stacks.Samples, ref: Any) -> dict[str, float]:
    """Median ms of 5 of each encoder of one window, ours and the reference's."""
    from otelprof.capture.profiles import encode

    steps = {n for _, n in found.cpu if n is not None}
    live = {n: LiveStep(n, (n + 1).to_bytes(16, "big"), (n + 1).to_bytes(8, "big")) for n in steps}
    sides = {
        "": (encode.otlp_request, encode.pprof, stacks.collapsed),
        "ref_": (ref.ref_otlp_request, ref.ref_pprof, ref.ref_collapsed),
    }
    out = {}
    for prefix, (otlp, pprof, collapsed) in sides.items():
        calls: dict[str, tuple[Any, ...]] = {
            "otlp": (otlp, found, live, [("service.name", "b")], "1", "w"),
            "pprof": (pprof, found),
            "collapsed_cpu": (collapsed, found.cpu.items()),
            "collapsed_device": (collapsed, found.device.items()),
        }
        for name, (function, *arguments) in calls.items():
            times = []
            for _ in range(5):
                start = time.perf_counter()
                function(*arguments)
                times.append(time.perf_counter() - start)
            out[f"{prefix}{name}"] = statistics.median(times) * 1e3
        out[f"{prefix}collapsed"] = out.pop(f"{prefix}collapsed_cpu") + out.pop(f"{prefix}collapsed_device")
    return out


def encode_lines(window: stacks.Samples | None) -> dict[str, float]:
    ref = reference_encoders()
    make = stacks.native_samples if native_available() else stacks.samples
    found = {
        key: make(gzip.decompress(p.read_bytes()))
        for fragment, key in ENCODE_TRACES
        for p in sorted(SHARED.glob(f"*{fragment}*.json.gz"))[:1]
    }
    if window is not None:
        found["live_window"] = window
    figures = {}
    for key, samples in found.items():
        t = encode_times(samples, ref)
        ours, theirs = (sum(t[f"{p}{n}"] for n in ("otlp", "pprof", "collapsed")) for p in ("", "ref_"))
        print(
            f"encoding, {key:<15}: {ours:.1f} ms (otlp {t['otlp']:.1f}, pprof {t['pprof']:.1f}, collapsed "
            f"{t['collapsed']:.1f}); reference {theirs:.1f} ms (otlp {t['ref_otlp']:.1f}, pprof "
            f"{t['ref_pprof']:.1f}, collapsed {t['ref_collapsed']:.1f})"
        )
        figures[f"encode_{key}_ms"], figures[f"encode_ref_{key}_ms"] = ours, theirs
    return figures


def bare_with_stack(run: Callable[..., float], active: int, trace_dir: str) -> Callable[[], float]:
    from torch.profiler import ProfilerActivity, profile, schedule

    def once() -> float:
        path = os.path.join(trace_dir, "bare.json")
        prof = profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(skip_first=1, wait=0, warmup=1, active=active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(path),
            with_stack=True,
        )
        with prof:
            seconds = run(prof.step)
        assert os.path.exists(path), "torch.profiler saved no trace"
        return seconds

    return once


def with_profiles(run: Callable[[], float], env: dict[str, str], pass_s: list[float]) -> Side:
    """otelprof's side, checking the window made its profile and noting the stacks pass's time."""
    side = instrumented(run, env)

    def teardown() -> None:
        session: Any = otelprof.instrumentation.session()
        profiles = session.windows.conversions.profiles if session is not None else None
        side.teardown()
        if env.get("OTELPROF_PROFILES_EXPORT") != "false":  # else none made (no trace kept either)
            assert profiles is not None and profiles.done == 1 and not profiles.failed, "no profile was made"
            pass_s.append(profiles.seconds[-1])

    return Side(run, side.setup, teardown)


def shared_lines() -> dict[str, float]:
    figures = {}
    for fragment, key in (("h100__gaunernst_bert", "bert_h100"), ("mi300__ddp_resnet18", "resnet18_mi300")):
        found = [p for p in SHARED.glob("*.json.gz") if fragment in p.name]
        if not found:
            continue
        data = gzip.decompress(found[0].read_bytes())
        events = len(json.loads(data)["traceEvents"])
        engines = [("", stacks.samples)]
        if native_available():
            engines.append(("native_", stacks.native_samples))
        for prefix, make in engines:
            times = []
            for _ in range(3):
                start = time.perf_counter()
                make(data)
                times.append(time.perf_counter() - start)
            ms = statistics.median(times) * 1e3
            label = f"{key} {prefix.rstrip('_') or 'python'}"
            print(f"stacks pass, {label:<21}: {ms:.1f} ms for {events} events ({ms * 1e3 / events:.2f} us/event)")
            figures[f"stacks_{prefix}{key}_ms"] = ms
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds of each comparison")
    parser.add_argument("--window-steps", type=int, default=5, help="active steps of the profiled window")
    parser.add_argument(
        "--reference-encoders", action="store_true", help="windows encoded by the encoders as they were (before)"
    )
    args = parser.parse_args()
    if args.reference_encoders:
        from otelprof.capture.profiles import encode

        ref = reference_encoders()
        encode.otlp_request, encode.pprof, stacks.collapsed = ref.ref_otlp_request, ref.ref_pprof, ref.ref_collapsed
    window_steps = 1 + args.window_steps
    run = make_loop(2 * window_steps + 2)  # a first step, the window, as many after
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
            "OTELPROF_SPOOL_DIR": os.path.join(tmp, "spool"),
            "OTELPROF_TRACE_DIR": os.path.join(tmp, "traces"),
            "OTELPROF_RUN_ID": "profiles",
            "OTELPROF_PROFILE": "true",
            "OTELPROF_PROFILE_SKIP_FIRST": "1",
            "OTELPROF_PROFILE_WAIT": "0",
            "OTELPROF_PROFILE_WARMUP": "1",
            "OTELPROF_PROFILE_ACTIVE": str(args.window_steps),
            "OTELPROF_PROFILE_REPEAT": "1",
            "OTELPROF_PROFILE_EARLY": "0",
            "OTELPROF_ANOMALY_FACTOR": "0",
            "OTELPROF_TRIGGER_SIGNAL": "none",
            "OTELPROF_PROFILE_OPTIONS": "with_stack",
        }
        pass_s: list[float] = []
        bare = bare_with_stack(run, args.window_steps, tmp)
        ours = interleaved(args.rounds, bare, with_profiles(run, env, pass_s))
        print(
            f"with_stack, torch.profiler : {ours.bare * 1e3:.3f} ms/step "
            f"(a {args.window_steps}-step window and as many after)"
        )
        print(f"with_stack, otelprof       : {ours.ours * 1e3:.3f} ms/step (spans, OTLP profile, pprof, collapsed)")
        print(f"with_stack, ratio          : {ours.ratio:.4f} +- {ours.ratio_error:.4f} (median of the rounds' ratios)")
        on = {**env, "OTELPROF_KEEP_TRACES": "0"}
        off = {**on, "OTELPROF_PROFILES_EXPORT": "false"}
        share = interleaved(args.rounds, with_profiles(run, off, []), with_profiles(run, on, pass_s))
        print(
            f"profiles on / off          : {share.ratio:.4f} +- {share.ratio_error:.4f} (otelprof with_stack windows)"
        )
        window_ms = statistics.median(pass_s) * 1e3
        print(f"stacks pass, live window   : {window_ms:.1f} ms on the conversion thread (median of {len(pass_s)})")
        figures.update(
            with_stack_bare_ms=ours.bare * 1e3,
            with_stack_otelprof_ms=ours.ours * 1e3,
            with_stack_ratio=ours.ratio,
            with_stack_ratio_error=ours.ratio_error,
            profiles_on_off_ratio=share.ratio,
            profiles_on_off_ratio_error=share.ratio_error,
            stacks_window_ms=window_ms,
        )
        window = stacks.samples_from_file(os.path.join(tmp, "bare.json"))
    figures.update(shared_lines())
    if not args.reference_encoders:
        figures.update(encode_lines(window))
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
