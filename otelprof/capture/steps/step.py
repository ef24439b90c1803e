"""What both step trackers share: the step record they close (``Step``), the phases, their
limits, and the hooks torch calls on either (the rules are in tracker.py's docstring)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PHASES = ("data", "forward", "backward", "optimizer")
#: Phase intervals kept per step (gradient accumulation and closures make several); later ones
#: are counted.
MAX_PHASE_SPANS = 64
#: Distinct optimizers told apart per step (more share the last slot's fate: they do not split).
MAX_OPTIMIZERS = 16
#: Forwards with no optimizer step and no explicit step before the hint is logged.
HINT_FORWARDS = 10
#: The same once a backward has run (gradient accumulation: many forwards before the first update).
HINT_TRAINING_FORWARDS = 256


@dataclass(slots=True)
class Step:
    number: int
    start_ns: int  # epoch nanoseconds
    end_ns: int
    phases: list[tuple[str, int, int]] = field(default_factory=list)  # (phase, start, end), in order
    phase_totals_ns: dict[str, int] = field(default_factory=dict)
    dropped_phases: int = 0
    samples: int | None = None
    tokens: int | None = None
    name: str = "train.step"
    micro_batches: int = 0  # DataLoader batches fetched in the step
    evaluation: bool = False  # begin_scope(evaluation=True): a span, in no step metric
    window: str | None = None  # to a profiling window: "recorded", "warmup" (with ":trigger"), "after" (windows.py)
    phase_modules: list[str | None] = field(default_factory=list)  # per phase: a forward's root module
    skipped: bool = False  # its optimizer update was skipped (a gradient scaler found inf/NaN)
    #: its memory peaks (StepRecord.memory), set by the session at its end
    memory: tuple[int | None, int | None, int | None, int] | None = None

    def phase_module(self, i: int) -> str | None:
        """The class name of the root module phase ``i`` timed (forwards; None: unknown)."""
        return self.phase_modules[i] if i < len(self.phase_modules) else None

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def now_ns() -> int:
    return time.time_ns()


def module_name(module: Any) -> str | None:
    """What a forward phase span names as its module: the root module's class name (a
    torch.compile OptimizedModule: the compiled module's); None without a module."""
    if module is None:
        return None
    name: str = type(module).__name__
    if name == "OptimizedModule":
        inner = getattr(module, "_orig_mod", None)
        if inner is not None:
            name = type(inner).__name__
    return name


def check_count(value: int | None, what: str = "a batch size") -> None:
    """The native binding's checks: a non-negative int or None."""
    if value is not None and (not isinstance(value, int) or value < 0):
        raise ValueError(f"{what} must be >= 0") if isinstance(value, int) else TypeError(f"{what} must be an int")


#: What the hooks call (torch passes a module, an optimizer... which the hooks ignore).
HOOKS = (
    "begin_data",
    "end_data",
    "data_end",
    "begin_forward",
    "end_forward",
    "begin_backward",
    "end_backward",
    "begin_optimizer",
    "end_optimizer",
)
#: The end of a gradient scaler's update, called by otelprof's own ``GradScaler.step`` wrapper
#: only (a frame dynamo skips), so not among the hooks torch calls (HOOKS).
UPDATE_HOOK = "end_update"


class TrackerHooks:
    """The hooks both trackers offer (HOOKS), set per instance."""

    begin_data: Callable[..., None]
    end_data: Callable[..., None]
    data_end: Callable[..., None]
    begin_forward: Callable[..., None]
    end_forward: Callable[..., None]
    begin_backward: Callable[..., None]
    end_backward: Callable[..., None]
    begin_optimizer: Callable[..., None]
    end_optimizer: Callable[..., None]
    end_update: Callable[..., None]
