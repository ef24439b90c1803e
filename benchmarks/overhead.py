"""otelprof's cost to a training loop, in two parts, each interleaved (ABBA) so drift in
machine load hits both sides alike; medians over rounds give the step-time ratios.

    python benchmarks/overhead.py [--rounds N] [--steps N] [--window-steps N]
        [--tiny-rounds N] [--window-rounds N] [--framework-rounds N] [--framework-steps N]
        [--start-rounds N] [--aa-rounds N] [--memory-off]

1. Always on: the same CPU training loop bare and instrumented (``otelprof.instrument()`` ...
   ``uninstrument()``: steps, phases, metrics, step spans). Target (issue 4): <= 1.005.
   ``--memory-off``: the tiny loop's comparison also runs with ``OTELPROF_STEP_MEMORY=false``,
   interleaved, for the per-step memory peaks' share.
2. A profiled window (``--window-rounds``, 0 skips): the loop under bare ``torch.profiler``
   (warmup 1, active N, its trace saved by ``on_trace_ready``) against otelprof with the same
   schedule and profiler settings (the trace then converted by the native core and exported on
   background threads). Both runs go on for as many steps again after the window, so the
   conversion's share of the CPU is paid inside the measured time. Target: <= 1.05.
3. Frameworks (``--framework-rounds``, 0 skips): a Hugging Face ``Trainer`` loop and a Lightning
   loop (benchmarks/frameworks.py) bare and under ``otelprof.instrument()``, which adds otelprof's
   callback to each Trainer built: the ratio of their seconds per optimizer update.
4. Process start (``--start-rounds``, 0 skips): ``python -c pass`` bare against the same with
   the ``otelprof run`` bootstrap on PYTHONPATH (what every Python process of the command pays
   when it never imports torch; target issue 13: <= 20 ms), and against ``otelprof run --
   python -c pass`` as typed (one more interpreter start: otelprof's launcher).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from prometheus_client import CollectorRegistry

import otelprof


def make_loop(steps: int, tiny: bool = False) -> Any:
    """The benchmark's training loop; ``tiny``: a one-weight model whose step is mostly the
    loop's own overhead, so the difference otelprof makes stands out of the machine's noise."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    model: torch.nn.Module = torch.nn.Sequential(
        torch.nn.Embedding(100, 64), torch.nn.TransformerEncoder(layer, num_layers=2)
    )
    if tiny:
        model = torch.nn.Sequential(torch.nn.Embedding(100, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 100, (8 * steps, 32))
    # every run starts from the same weights and optimizer state, so both sides do the same
    # arithmetic (drifting weights made later runs slower than earlier ones, bare or not)
    initial = copy.deepcopy((model.state_dict(), opt.state_dict()))

    def run(step: Callable[[], None] | None = None) -> float:
        """Seconds per step over one epoch but its first step (``step``: the bare profiler's
        ``prof.step``). The first step is left out on both sides: otelprof starts its exporter,
        span thread and /metrics server there, once per process, not per step or window."""
        model.load_state_dict(initial[0])
        opt.load_state_dict(copy.deepcopy(initial[1]))
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=8)
        start = 0.0
        for i, (batch,) in enumerate(loader):
            if i == 1:
                start = time.perf_counter()
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if step is not None:
                step()
        return (time.perf_counter() - start) / (steps - 1)

    return run


@dataclass
class Side:
    """One side of a comparison: ``run`` is timed; ``setup`` and ``teardown`` (otelprof's
    instrument/uninstrument) run around it, outside the time and before the collector reset."""

    run: Callable[[], float]
    setup: Callable[[], None] = lambda: None
    teardown: Callable[[], None] = lambda: None


def interleaved(rounds: int, bare: Callable[[], float] | Side, ours: Callable[[], float] | Side) -> Interleaved:
    """``bare`` and ``ours`` over ``rounds`` rounds in ABBA order (each round's pair runs
    back to back, so slow drift in machine load hits both alike)."""
    times = timed_rounds(rounds, [s if isinstance(s, Side) else Side(s) for s in (bare, ours)])
    return Interleaved(times[0], times[1])


def timed_rounds(rounds: int, sides: list[Side]) -> list[list[float]]:
    """Each side's times over ``rounds`` rounds, the order reversed every other round (ABBA,
    or ABCCBA with three sides)."""
    times: list[list[float]] = [[] for _ in sides]
    order = list(range(len(sides)))
    for round_ in range(rounds):
        for which in order if round_ % 2 == 0 else order[::-1]:
            side = sides[which]
            side.setup()
            # Both sides start the timed run from the same collector state: what setup left
            # behind is collected, and everything alive is frozen, so a full collection of
            # torch's ~300k objects (~0.1 s, as long as a whole run) falls in neither side's
            # time by chance; collections of what the run itself allocates still count.
            gc.collect()
            gc.freeze()
            try:
                times[which].append(side.run())
            finally:
                gc.unfreeze()
                side.teardown()
    return times


class Interleaved:
    """Medians of each side; the medians of the rounds' ratios and differences, each with its
    standard error (1.2533 s / sqrt(n)): how far this machine lets the figure be trusted."""

    def __init__(self, bare: list[float], ours: list[float]) -> None:
        self.bare = statistics.median(bare)
        self.ours = statistics.median(ours)
        ratios = [y / x for x, y in zip(bare, ours, strict=True)]
        diffs = [y - x for x, y in zip(bare, ours, strict=True)]
        self.ratio, self.ratio_error = statistics.median(ratios), _error(ratios)
        self.diff, self.diff_error = statistics.median(diffs), _error(diffs)


def _error(values: list[float]) -> float:
    return 1.2533 * statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")


def instrumented(run: Callable[[], float], env: dict[str, str]) -> Side:
    sessions: list[Any] = []

    def setup() -> None:
        session = otelprof.instrument(environ=env, registry=CollectorRegistry())
        if session is None:
            raise RuntimeError("otelprof did not instrument")
        sessions.append(session)

    def teardown() -> None:
        session = sessions.pop()
        otelprof.uninstrument()
        if session.windows is not None and env.get("OTELPROF_PROFILE") != "false":
            assert session.windows.windows_done == 1, "the window was not converted"

    return Side(run, setup, teardown)


def bare_profiler(run: Callable[..., float], active: int, trace_dir: str) -> Callable[[], float]:
    """The loop under torch.profiler with the window's schedule, trace saved by on_trace_ready."""
    from torch.profiler import ProfilerActivity, profile, schedule

    def once() -> float:
        path = os.path.join(trace_dir, "bare.json")
        prof = profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(skip_first=1, wait=0, warmup=1, active=active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(path),
        )
        with prof:
            seconds = run(prof.step)
        assert os.path.exists(path), "torch.profiler saved no trace"
        return seconds

    return once


def window_lines(rounds: int, steps: int, env: dict[str, str], tmp: str) -> dict[str, float]:
    """Part 2: a profiled window under bare torch.profiler against otelprof's."""
    window_steps = 1 + steps  # warmup + active
    window_run = make_loop(2 * window_steps + 2)  # a first step, the window, as many after
    schedule_env = {
        **env,
        "OTELPROF_PROFILE": "true",
        "OTELPROF_PROFILE_SKIP_FIRST": "1",
        "OTELPROF_PROFILE_WAIT": "0",
        "OTELPROF_PROFILE_WARMUP": "1",
        "OTELPROF_PROFILE_ACTIVE": str(steps),
        "OTELPROF_PROFILE_REPEAT": "1",
        "OTELPROF_ANOMALY_FACTOR": "0",
        "OTELPROF_TRIGGER_SIGNAL": "none",
    }
    bare_window = bare_profiler(window_run, steps, tmp)
    window = interleaved(rounds, bare_window, instrumented(window_run, schedule_env))
    wb, wi, window_ratio, window_error = window.bare, window.ours, window.ratio, window.ratio_error
    met = "met" if window_ratio <= 1.05 else "NOT met"
    print(f"window, torch.profiler  : {wb * 1e3:.3f} ms/step (a {steps}-step window and as many after)")
    print(f"window, otelprof        : {wi * 1e3:.3f} ms/step (the same, converted and exported in the background)")
    print(
        f"window, ratio           : {window_ratio:.4f} +- {window_error:.4f} "
        f"(median of the rounds' ratios; target <= 1.05: {met})"
    )
    return dict(
        window_bare_ms=wb * 1e3,
        window_otelprof_ms=wi * 1e3,
        window_ratio=window_ratio,
        window_ratio_error=window_error,
    )


def framework_lines(rounds: int, steps: int, env: dict[str, str]) -> dict[str, float]:
    """Part 3: each framework loop bare and instrumented, interleaved."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)  # benchmarks.frameworks, when run as a script
    from benchmarks import frameworks

    figures: dict[str, float] = {}
    for name, make in (("hf_trainer", frameworks.hf_loop), ("lightning", frameworks.lightning_loop)):
        try:
            run = make(steps)
        except ImportError as exc:
            print(f"{name:<24}: skipped ({exc})")
            continue
        run()  # warm-up
        result = interleaved(rounds, run, instrumented(run, env))
        print(
            f"{name + ', ratio':<24}: {result.ratio:.4f} +- {result.ratio_error:.4f} "
            f"({result.bare * 1e3:.2f} ms/update bare, {result.ours * 1e3:.2f} instrumented; {rounds} rounds)"
        )
        figures.update({f"{name}_bare_ms": result.bare * 1e3, f"{name}_ratio": result.ratio})
    return figures


def start_lines(rounds: int) -> dict[str, float]:
    """Part 4: a process that never imports torch, bare and under ``otelprof run``."""
    from otelprof.cli.run import command_environment

    bare = [sys.executable, "-c", "pass"]
    environ = dict(os.environ)
    bootstrapped = command_environment(environ)

    def timed(command: list[str], env: dict[str, str]) -> Callable[[], float]:
        def once() -> float:
            start = time.perf_counter()
            subprocess.run(command, env=env, check=True)
            return time.perf_counter() - start

        return once

    process = interleaved(rounds, timed(bare, environ), timed(bare, bootstrapped))
    command = interleaved(
        rounds, timed(bare, environ), timed([sys.executable, "-m", "otelprof", "run", "--", *bare], environ)
    )
    met = "met" if process.diff <= 0.020 else "NOT met"
    print(
        f"process start, bare     : {process.bare * 1e3:.1f} ms (python -c pass, median of {rounds} rounds)\n"
        f"process start, bootstrap: {process.diff * 1e3:+.1f} +- {process.diff_error * 1e3:.1f} ms "
        f"(the bootstrap on PYTHONPATH; target <= 20 ms: {met})\n"
        f"otelprof run, as typed  : {command.diff * 1e3:+.1f} +- {command.diff_error * 1e3:.1f} ms "
        f"(python -m otelprof run -- python -c pass: one more interpreter start)"
    )
    return {
        "start_bare_ms": process.bare * 1e3,
        "start_bootstrap_ms": process.diff * 1e3,
        "start_otelprof_run_ms": command.diff * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40, help="steps per always-on run (at least 2)")
    parser.add_argument("--window-steps", type=int, default=5, help="active steps of the profiled window")
    parser.add_argument("--tiny-rounds", type=int, default=100, help="rounds of the per-step cost's tiny loop")
    parser.add_argument(
        "--window-rounds", type=int, default=40, help="rounds of the profiled-window comparison (0: skip)"
    )
    parser.add_argument(
        "--memory-off",
        action="store_true",
        help="part 1's tiny loop also instrumented with OTELPROF_STEP_MEMORY=false, interleaved (both implied ratios)",
    )
    parser.add_argument("--framework-rounds", type=int, default=6, help="rounds of each framework loop (0: skip)")
    parser.add_argument("--framework-steps", type=int, default=20, help="optimizer updates per framework run")
    parser.add_argument("--start-rounds", type=int, default=40, help="rounds of the process-start comparison (0: skip)")
    parser.add_argument("--aa-rounds", type=int, default=0, help="rounds of a bare-against-bare control (0: skip)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = make_loop(args.steps)
    run()  # warm-up
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
            "OTELPROF_SPOOL_DIR": os.path.join(tmp, "spool"),
            "OTELPROF_RUN_ID": "overhead",
            "OTELPROF_PROFILE": "false",
        }
        always = interleaved(args.rounds, run, instrumented(run, env))
        b, i, ratio, error = always.bare, always.ours, always.ratio, always.ratio_error
        print(f"always on, bare         : {b * 1e3:.3f} ms/step (median of {args.rounds} runs of {args.steps} steps)")
        print(f"always on, instrumented : {i * 1e3:.3f} ms/step (steps, phases, metrics, step spans)")
        print(
            f"always on, wall ratio   : {ratio:.4f} +- {error:.4f} (median of the rounds' ratios +- its standard error)"
        )
        figures.update(bare_ms=b * 1e3, instrumented_ms=i * 1e3, ratio=ratio, ratio_error=error)

        # otelprof's own cost per step, measured where it is most of the step (a tiny model):
        # on a shared VM the wall ratio above has a standard error of ~1-2 % (runs of the same
        # work differ by ~7 %), too coarse to tell 1.005 from 1.0; this difference, over the
        # transformer's step time in the same run, resolves it (the verdict uses it)
        # (the median of the rounds' paired differences: pairs cancel the machine's drift)
        tiny = make_loop(200, tiny=True)
        sides = [Side(tiny), instrumented(tiny, env)]
        if args.memory_off:  # the per-step memory peaks' own share: the same loop without them
            sides.append(instrumented(tiny, {**env, "OTELPROF_STEP_MEMORY": "false"}))
        times = timed_rounds(args.tiny_rounds, sides)
        paired = Interleaved(times[0], times[1])
        cost, cost_error = paired.diff, paired.diff_error
        implied, implied_error = 1 + cost / b, cost_error / b
        met = "met" if implied <= 1.005 else "NOT met"
        print(
            f"per-step cost           : {cost * 1e6:.1f} +- {cost_error * 1e6:.1f} us "
            f"(tiny loop, {args.tiny_rounds} rounds: {paired.bare * 1e6:.1f} bare, "
            f"{paired.ours * 1e6:.1f} instrumented)"
        )
        print(
            f"always on, implied      : {implied:.4f} +- {implied_error:.4f} "
            f"(that cost over the bare step above; target <= 1.005: {met})"
        )
        if args.memory_off:
            off = Interleaved(times[0], times[2])
            off_implied, off_error = 1 + off.diff / b, off.diff_error / b
            print(
                f"peaks off (STEP_MEMORY) : {off.diff * 1e6:.1f} +- {off.diff_error * 1e6:.1f} us, "
                f"implied {off_implied:.4f} +- {off_error:.4f} ({off.ours * 1e6:.1f} us/step instrumented, median)"
            )
            print(
                f"peaks on - off          : {(cost - off.diff) * 1e6:+.1f} us/step (medians of the paired differences)"
            )
            figures.update(memory_off_cost_us=off.diff * 1e6, memory_off_implied_ratio=off_implied)
        gap, gap_error = ratio - implied, (error**2 + implied_error**2) ** 0.5
        agree = "agree" if abs(gap) <= 2 * gap_error else "DISAGREE"
        print(f"wall - implied          : {gap:+.4f} +- {gap_error:.4f} ({agree} within two standard errors)")
        figures.update(
            step_cost_us=cost * 1e6,
            step_cost_error_us=cost_error * 1e6,
            implied_ratio=implied,
            implied_ratio_error=implied_error,
        )
        if args.aa_rounds:
            # the protocol against itself: bare against bare must read 1 within its error, or the
            # comparison favours one side for a reason that is not otelprof
            aa = interleaved(args.aa_rounds, run, run)
            print(f"always on, A/A control  : {aa.ratio:.4f} +- {aa.ratio_error:.4f} (bare against bare)")
            figures.update(aa_ratio=aa.ratio, aa_ratio_error=aa.ratio_error)

        if args.window_rounds:
            figures.update(window_lines(args.window_rounds, args.window_steps, env, tmp))
        if args.framework_rounds:
            figures.update(framework_lines(args.framework_rounds, args.framework_steps, env))
    if args.start_rounds:
        figures.update(start_lines(args.start_rounds))
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
