"""Wrapping a framework's ``Trainer.__init__`` so every Trainer built while otelprof instruments
gets its callback (transformers, Lightning), and undoing it."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)


def patch_trainer_init(trainer_class: Any, instrument: Callable[[Any], object]) -> None:
    """Every ``trainer_class`` built from now on gets ``instrument(trainer)`` after its own
    ``__init__`` (once; a failure is logged, never raised into the job)."""
    init = trainer_class.__init__
    if getattr(init, "_otelprof", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            instrument(self)
        except Exception:
            _log.warning("otelprof could not add its callback to the Trainer", exc_info=True)

    __init__._otelprof = True  # type: ignore[attr-defined]
    trainer_class.__init__ = __init__


def unpatch_trainer_init(trainer_class: Any) -> None:
    """Undoes ``patch_trainer_init``."""
    init = trainer_class.__init__
    if getattr(init, "_otelprof", False):
        trainer_class.__init__ = init.__wrapped__
