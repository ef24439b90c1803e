"""Hugging Face ``Trainer``: one step per optimizer update, from the Trainer's own events.

``OtelprofCallback`` ends a step at ``on_step_end`` (``state.global_step`` updates), counts the
update's micro-batches (``on_substep_end``), and puts an evaluation the Trainer runs between
steps (``control.should_evaluate``, until ``on_evaluate``) in an ``evaluation`` span. The run
id is ``TrainingArguments.run_name`` when one is set and the environment names none.

Samples and tokens per step: ``instrument_trainer(trainer)`` (what the automatic registration
does) also sees each micro-batch ``Trainer.training_step`` gets, so they are the update's own;
a callback added by hand leaves them to the DataLoader hook, whose counts follow the fetches
(accelerate fetches one batch ahead).
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Any

from transformers import TrainerCallback

from ..capture.steps.hooks import batch_size
from . import _steps
from ._patch import patch_trainer_init, unpatch_trainer_init

_log = logging.getLogger(__name__)


class OtelprofCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]  # Any: transformers is not followed
    """Add to ``Trainer(callbacks=[OtelprofCallback()])``, or let otelprof add it (it does while
    instrumenting, unless one is there). Does nothing while otelprof is not instrumenting."""

    def __init__(self) -> None:
        self._micro_batches = 0
        self._samples: int | None = None
        self._tokens: int | None = None
        self._evaluating = False

    # --- what instrument_trainer feeds it -----------------------------------------------------

    def observe_batch(self, inputs: Any) -> None:
        """One micro-batch ``training_step`` is about to run (samples and tokens inferred as the
        DataLoader hook does: the first tensor's leading dimension, ids' (batch, sequence))."""
        try:
            samples, tokens = batch_size(inputs)
        except Exception:
            return
        if samples is not None:
            self._samples = (self._samples or 0) + samples
        if tokens is not None:
            self._tokens = (self._tokens or 0) + tokens

    # --- TrainerCallback ----------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run_name = _explicit_run_name(args)
        if run_name:
            _steps.name_run(run_name, "transformers.run_name")
        self._reset()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._micro_batches += 1

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # global_step counts the updates done, this one included
        number = state.global_step - 1 if state.global_step > 0 else None
        _steps.end_step(self._samples, self._tokens, self._micro_batches + 1, number)
        self._reset()
        self._maybe_evaluate(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._maybe_evaluate(control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._evaluating:
            self._evaluating = False
            _steps.end_evaluation()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.on_evaluate(args, state, control)

    def _maybe_evaluate(self, control: Any) -> None:
        # the Trainer evaluates right after this event when a callback before ours (its
        # DefaultFlowCallback) asked for it
        if getattr(control, "should_evaluate", False) and not self._evaluating:
            self._evaluating = True
            _steps.begin_evaluation()

    def _reset(self) -> None:
        self._micro_batches = 0
        self._samples = self._tokens = None


def _explicit_run_name(args: Any) -> str | None:
    """``run_name`` if the user set it (not the output-dir default, which every run shares)."""
    name = getattr(args, "run_name", None)
    if not name or name == getattr(args, "output_dir", None):
        return None
    return str(name)


def instrument_trainer(trainer: Any) -> OtelprofCallback:
    """Adds the callback to ``trainer`` (once) and lets it see each micro-batch; returns it."""
    handler = trainer.callback_handler
    callback = next((c for c in handler.callbacks if isinstance(c, OtelprofCallback)), None)
    if callback is None:
        callback = OtelprofCallback()
        trainer.add_callback(callback)
    step = trainer.training_step
    if not getattr(step, "_otelprof", False):

        @functools.wraps(step)
        def training_step(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            callback.observe_batch(inputs)
            return step(model, inputs, *args, **kwargs)

        training_step._otelprof = True  # type: ignore[attr-defined]
        trainer.training_step = training_step  # this trainer only: a subclass's override is kept
    return callback


def patch(module: ModuleType) -> None:
    """``transformers.trainer``: every Trainer built from now on is instrumented."""
    patch_trainer_init(module.Trainer, instrument_trainer)  # a subclass's override of training_step is kept


def unpatch(module: ModuleType) -> None:
    unpatch_trainer_init(module.Trainer)
