"""The torch hooks that report a training loop's activity to a StepTracker.

- data: ``_BaseDataLoaderIter.__next__`` (every DataLoader, any number of workers);
- forward: the global module forward pre/post hooks (outermost module call only);
- backward: ``torch.autograd.backward`` (what ``Tensor.backward`` calls);
- optimizer: the global optimizer step pre/post hooks.

Everything installed is recorded in ``TorchHooks`` and undone by ``remove()``. A hook never
raises into the loop: a failure is logged once and the hook goes quiet.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from .steps import StepTracker

_log = logging.getLogger(__name__)


def batch_size(batch: Any) -> tuple[int | None, int | None]:
    """(samples, tokens) of a batch: the first tensor's leading dimension; tokens when that
    tensor holds integer ids of shape (batch, sequence)."""
    import torch

    seen = 0
    stack = [batch]
    while stack and seen < 64:  # bounded walk: batches can be deep structures
        item = stack.pop(0)
        seen += 1
        if isinstance(item, torch.Tensor):
            if item.dim() == 0:
                return None, None
            samples = int(item.shape[0])
            integer = not item.dtype.is_floating_point and not item.dtype.is_complex and item.dtype != torch.bool
            return samples, int(item.numel()) if integer and item.dim() == 2 else None
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None, None


class TorchHooks:
    def __init__(self, tracker: StepTracker) -> None:
        self._tracker = tracker
        self._undo: list[Callable[[], None]] = []
        self._failed = False

    def install(self) -> None:
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim
        from torch.utils.data import dataloader

        tracker = self._tracker
        guard = self._guard

        def optimizer_pre(_opt: Any, _args: Any, _kwargs: Any) -> None:
            guard(tracker.phase_begin, "optimizer")

        def optimizer_post(_opt: Any, _args: Any, _kwargs: Any) -> None:
            guard(tracker.phase_end, "optimizer")

        def forward_pre(_module: Any, _input: Any) -> None:
            guard(tracker.phase_begin, "forward")

        def forward_post(_module: Any, _input: Any, _output: Any) -> None:
            guard(tracker.phase_end, "forward")

        for handle in (
            optim.register_optimizer_step_pre_hook(optimizer_pre),
            optim.register_optimizer_step_post_hook(optimizer_post),
            nn_module.register_module_forward_pre_hook(forward_pre),
            _forward_hook(nn_module, forward_post),
        ):
            self._undo.append(handle.remove)

        original_backward = torch.autograd.backward

        @functools.wraps(original_backward)
        def backward(*args: Any, **kwargs: Any) -> Any:
            guard(tracker.phase_begin, "backward")
            try:
                return original_backward(*args, **kwargs)
            finally:
                guard(tracker.phase_end, "backward")

        self._patch(torch.autograd, "backward", backward)

        iterator = dataloader._BaseDataLoaderIter
        original_next = iterator.__next__

        @functools.wraps(original_next)
        def next_batch(it: Any) -> Any:
            guard(tracker.phase_begin, "data")
            try:
                batch = original_next(it)
            finally:
                guard(tracker.phase_end, "data")
            guard(self._count_batch, batch)
            return batch

        self._patch(iterator, "__next__", next_batch)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _count_batch(self, batch: Any) -> None:
        samples, tokens = batch_size(batch)
        self._tracker.set_batch(samples, tokens)

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)

        def restore() -> None:
            if getattr(owner, name) is replacement:  # someone patched over us: leave theirs
                setattr(owner, name, original)

        self._undo.append(restore)

    def _guard(self, call: Callable[[Any], None], arg: Any) -> None:
        if self._failed:
            return
        try:
            call(arg)
        except Exception:
            self._failed = True
            _log.warning("otelprof step tracking stopped after an internal error", exc_info=True)


def _forward_hook(nn_module: Any, hook: Callable[[Any, Any, Any], None]) -> Any:
    """The post hook runs even when forward raises (torch >= 2.1), so nesting stays balanced."""
    try:
        return nn_module.register_module_forward_hook(hook, always_call=True)
    except TypeError:  # pragma: no cover - older torch
        return nn_module.register_module_forward_hook(hook)
