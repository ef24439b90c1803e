"""Lightning (``lightning.pytorch`` and ``pytorch_lightning``): one step per optimizer update.

The callback counts each training batch (``on_train_batch_start``: samples and tokens inferred
from the batch as the DataLoader hook does) and ends the step at the ``on_train_batch_end``
where ``trainer.global_step`` moved (an optimizer stepped; with ``accumulate_grad_batches=N``
every N-th batch). Steps are numbered by the updates done before them: ``global_step`` counts
every optimizer's steps (manual optimization with two optimizers moves it by 2 a batch), so the
callback counts the batches that stepped itself, from where the fit starts. Validation, the
sanity check's included, is an ``evaluation`` span from ``on_validation_start`` to
``on_validation_end``. Lightning has no run name of its own: the run id stays the environment's.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any

from ..capture.steps.hooks import batch_size
from . import _steps
from ._patch import patch_trainer_init, unpatch_trainer_init

_log = logging.getLogger(__name__)
_classes: dict[str, type] = {}


class _Counts:
    """What the callback keeps between a step's batches (one trainer at a time)."""

    def __init__(self) -> None:
        self.micro_batches = 0
        self.samples: int | None = None
        self.tokens: int | None = None
        self.global_step = 0
        self.updates = 0  # updates done: the number of the step in progress
        self.evaluating = False

    def reset(self) -> None:
        self.micro_batches = 0
        self.samples = self.tokens = None

    def add(self, batch: Any) -> None:
        self.micro_batches += 1
        try:
            samples, tokens = batch_size(batch)
        except Exception:
            return
        if samples is not None:
            self.samples = (self.samples or 0) + samples
        if tokens is not None:
            self.tokens = (self.tokens or 0) + tokens


def _make(base: type) -> type:
    class OtelprofCallback(base):  # type: ignore[misc, unused-ignore]  # base: a Lightning class, Any here
        """otelprof's steps from Lightning's loop: add to ``Trainer(callbacks=[...])``, or let
        otelprof add it (it does while instrumenting). Does nothing while otelprof is not
        instrumenting."""

        def __init__(self) -> None:
            self._counts = _Counts()

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self._counts.reset()
            self._counts.global_step = trainer.global_step
            self._counts.updates = _updates_done(trainer, pl_module)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            counts = self._counts
            if counts.micro_batches == 0:
                counts.global_step = trainer.global_step
            counts.add(batch)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            counts = self._counts
            if trainer.global_step != counts.global_step:  # an optimizer stepped in this batch
                _steps.end_step(counts.samples, counts.tokens, counts.micro_batches, counts.updates)
                counts.updates += 1
                counts.reset()

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            if not self._counts.evaluating:
                self._counts.evaluating = True
                _steps.begin_evaluation()

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if self._counts.evaluating:
                self._counts.evaluating = False
                _steps.end_evaluation()

    OtelprofCallback.__module__ = __name__
    return OtelprofCallback


def _updates_done(trainer: Any, pl_module: Any) -> int:
    """Updates done when a fit starts (a resumed one's included): ``global_step`` with automatic
    optimization (one optimizer); with manual optimization, Lightning's count of the batches done
    (its loggers' step: each batch counts, as manual optimization accumulates nothing)."""
    try:
        if getattr(pl_module, "automatic_optimization", True):
            return int(trainer.global_step)
        return int(trainer.fit_loop.epoch_loop._batches_that_stepped)
    except Exception:
        return 0


def callback_class(package: str = "lightning.pytorch") -> type:
    """The callback for ``package`` (``lightning.pytorch`` or ``pytorch_lightning``: each
    Trainer accepts only its own package's ``Callback``)."""
    cls = _classes.get(package)
    if cls is None:
        cls = _classes[package] = _make(importlib.import_module(package).Callback)
    return cls


def __getattr__(name: str) -> Any:
    """``OtelprofCallback``: the one for ``lightning.pytorch``, or ``pytorch_lightning`` alone."""
    if name == "OtelprofCallback":
        try:
            return callback_class("lightning.pytorch")
        except ImportError:
            return callback_class("pytorch_lightning")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _package(module: ModuleType) -> str:
    return "pytorch_lightning" if module.__name__.startswith("pytorch_lightning") else "lightning.pytorch"


def instrument_trainer(trainer: Any, package: str = "lightning.pytorch") -> Any:
    """Adds the callback to ``trainer`` unless it has one; returns it."""
    cls = callback_class(package)
    for callback in trainer.callbacks:
        if isinstance(callback, cls):
            return callback
    callback = cls()
    trainer.callbacks.append(callback)
    return callback


def patch(module: ModuleType) -> None:
    """``lightning.pytorch.trainer.trainer`` (or pytorch_lightning's): every Trainer built from
    now on is instrumented."""
    package = _package(module)
    patch_trainer_init(module.Trainer, lambda trainer: instrument_trainer(trainer, package))


def unpatch(module: ModuleType) -> None:
    unpatch_trainer_init(module.Trainer)
