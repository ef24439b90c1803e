"""The one place the framework callbacks talk to the step tracker.

The callbacks know where a step ends (the framework's optimizer update), how many micro-batches
and samples it had, and when an evaluation runs; these functions hand that to the running
session's tracker through its explicit API, and do nothing when otelprof is not instrumenting.
Nothing here raises into the training loop: a failure is logged once and the rest goes quiet.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)


def _no_session() -> Any:
    return None


#: the running session, or None (``capture.session.session``, handed over by ``install``: the
#: session imports the integrations, so they do not import it back)
_current: Callable[[], Any] = _no_session
#: The span an evaluation (HF ``evaluate``, Lightning's validation loop) gets instead of a step.
EVALUATION = "evaluation"
_failed = False


def _tracker() -> Any:
    session = _current()
    return None if session is None or _failed else session.tracker


def _guard(what: str, exc: Exception) -> None:
    global _failed
    if not _failed:
        _failed = True
        _log.warning("otelprof's framework callback stopped after an error (%s)", what, exc_info=exc)


def end_step(
    samples: int | None = None,
    tokens: int | None = None,
    micro_batches: int | None = None,
    number: int | None = None,
) -> None:
    """The framework's optimizer update ended a step: it closes now, numbered ``number`` (the
    framework's 0-based count of updates) with these counts. ``samples``/``tokens`` replace the
    sums of the step's DataLoader fetches (None: those sums); ``micro_batches`` replaces the
    number of its fetches, which is off for a loader that fetches ahead (accelerate, Lightning)
    or splits one fetched batch (Composer)."""
    tracker = _tracker()
    if tracker is None:
        return
    try:
        tracker.step(number, samples, tokens, micro_batches)
    except Exception as exc:
        _guard("end_step", exc)


def begin_evaluation() -> None:
    """An evaluation starts: its work goes to an ``evaluation`` span, not to a training step."""
    tracker = _tracker()
    if tracker is None:
        return
    try:
        tracker.begin_scope(EVALUATION, True)
    except Exception as exc:
        _guard("begin_evaluation", exc)


def end_evaluation() -> None:
    tracker = _tracker()
    if tracker is None:
        return
    try:
        tracker.end_scope()
    except Exception as exc:
        _guard("end_evaluation", exc)


def name_run(run_id: str, source: str) -> bool:
    """The framework's run name becomes the run id (traces, labels) when the environment gave
    none and the first step has not begun (after that, steps are already named); True if taken."""
    session = _current()
    if session is None or not run_id:
        return False
    identity = session.identity
    if identity.run_id_source != "random" or session.metrics is not None:
        return False
    session.identity = dataclasses.replace(identity, run_id=run_id, run_id_source=source)
    return True


def reset(current: Callable[[], Any]) -> None:
    """A new session starts with a working adapter (instrument() after a failure); ``current``
    returns the running session."""
    global _failed, _current
    _failed = False
    _current = current
