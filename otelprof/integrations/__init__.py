"""Framework integrations: exact steps from the framework's own training loop.

Each integration is a callback for the framework's callback API (Hugging Face ``Trainer``,
Lightning, Composer) that ends a step at the framework's optimizer update, counts the samples
and micro-batches of that update, and puts evaluation in a span of its own. While otelprof is
instrumenting, ``install()`` adds the callback to every ``Trainer`` built (HF and Lightning),
waiting for the framework's import if it has not happened yet; ``uninstall()`` undoes it.
By hand: ``otelprof.integrations.transformers.OtelprofCallback`` and the others.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import _steps
from ._imports import PostImportHook

_log = logging.getLogger(__name__)
#: module the framework's Trainer lives in -> our module that patches it (``patch(module)``,
#: ``unpatch(module)``)
TARGETS = {
    "transformers.trainer": "transformers",
    "lightning.pytorch.trainer.trainer": "lightning",
    "pytorch_lightning.trainer.trainer": "lightning",
}
_lock = threading.Lock()
_hook: PostImportHook | None = None
_patched: list[ModuleType] = []


def _integration(target: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{TARGETS[target]}")


def _on_import(module: ModuleType) -> None:
    _integration(module.__name__).patch(module)
    with _lock:
        _patched.append(module)


def install(current: Callable[[], Any]) -> None:
    """Adds the callbacks automatically from now on (frameworks imported now or later);
    ``current`` returns the running session (or None), which they hand steps to."""
    global _hook
    _steps.reset(current)
    with _lock:
        if _hook is not None:
            return
        _hook = PostImportHook(tuple(TARGETS), _on_import)
    _hook.install()


def uninstall() -> None:
    """Stops adding callbacks and restores the frameworks' classes (Trainers built meanwhile
    keep their callback, which does nothing without a session)."""
    global _hook
    with _lock:
        hook, _hook = _hook, None
        patched, _patched[:] = list(_patched), []
    if hook is not None:
        hook.remove()
    for module in patched:
        try:
            _integration(module.__name__).unpatch(module)
        except Exception:
            _log.warning("otelprof could not restore %s", module.__name__, exc_info=True)
