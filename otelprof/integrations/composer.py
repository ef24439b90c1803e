"""MosaicML Composer: ``Trainer(callbacks=[OtelprofCallback()])``.

Composer's batch is one optimizer update (its micro-batches run inside it): the step ends at
``BATCH_END`` with the batch's samples and tokens (inferred from ``state.batch`` at
``AFTER_DATALOADER`` as the DataLoader hook does) and its micro-batches (``BEFORE_FORWARD``
events of the batch). Each evaluator's run (``EVAL_START`` to ``EVAL_END``) is an ``evaluation``
span. The run id is ``state.run_name`` (Composer names every run, the same on every rank) when
the environment names none. Composer's ``TorchProfiler`` callback keeps working beside it.
"""

from __future__ import annotations

from typing import Any

from composer.core import Callback

from ..capture.steps.hooks import batch_size
from . import _steps


class OtelprofCallback(Callback):  # type: ignore[misc, unused-ignore]  # Any: composer is not followed
    """Does nothing while otelprof is not instrumenting (``otelprof run`` or ``otelprof.instrument()``)."""

    def __init__(self) -> None:
        self._samples: int | None = None
        self._tokens: int | None = None
        self._micro_batches = 0
        self._evaluating = False

    def fit_start(self, state: Any, logger: Any) -> None:
        _steps.name_run(str(getattr(state, "run_name", "") or ""), "composer.run_name")

    def after_dataloader(self, state: Any, logger: Any) -> None:
        try:
            self._samples, self._tokens = batch_size(state.batch)
        except Exception:
            self._samples = self._tokens = None
        self._micro_batches = 0

    def before_forward(self, state: Any, logger: Any) -> None:
        if not self._evaluating:
            self._micro_batches += 1

    def batch_end(self, state: Any, logger: Any) -> None:
        try:  # the batches done, this one included (Composer counts it before BATCH_END)
            done = int(state.timestamp.batch)
        except Exception:
            done = 0
        _steps.end_step(self._samples, self._tokens, self._micro_batches or None, done - 1 if done > 0 else None)
        self._samples = self._tokens = None
        self._micro_batches = 0

    def eval_start(self, state: Any, logger: Any) -> None:
        if not self._evaluating:
            self._evaluating = True
            _steps.begin_evaluation()

    def eval_end(self, state: Any, logger: Any) -> None:
        if self._evaluating:
            self._evaluating = False
            _steps.end_evaluation()
