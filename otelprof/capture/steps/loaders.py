"""Batches counted where the loop takes them, for loaders that fetch ahead.

Some loaders wrap a DataLoader iterator in a generator (``__iter__`` with ``yield``) and fetch
from it ahead of what they yield: accelerate's ``DataLoaderShard`` takes the next batch before
yielding the current one (to know the last). Counted at the DataLoader, the batch fetched ahead
went to the step before the one that used it (per step ``[5, 4, 4, 4, 4, 1]`` for
``[4, 4, 4, 4, 4, 2]``). So the ``__iter__`` of such loaders (accelerate's ``DataLoaderAdapter``
subclasses; DataLoader subclasses, also those defined later) is wrapped: each batch it yields is
one fetch (the wait for it is data time), its end the exhausted fetch, and the DataLoader fetches
made inside it are not counted (``inside()``, read by the DataLoader hook: one attribute read).
A DataLoader's own ``prefetch_factor`` workers need none of this: ``__next__`` is the consumption.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

from .dynamo import _AfterImport

_ACCELERATE = "accelerate.data_loader"
_NO_BATCH = object()


class _Inside(threading.local):
    depth = 0  # an outer loader's fetch is running on this thread


INSIDE = _Inside()

Sizes = Callable[[Any], tuple[int | None, int | None]]


class OuterLoaders:
    """Wraps the ``__iter__`` of the loaders that wrap a DataLoader iterator in a generator."""

    def __init__(self, begin_data: Any, end_data: Any, data_end: Any, sizes: Sizes, failed: Any) -> None:
        self._hooks = (begin_data, end_data, data_end, sizes, failed)
        self._undo: list[Callable[[], None]] = []
        self._finder: _AfterImport | None = None
        self.wrappers: list[Any] = []  # the wrappers' functions (frames dynamo skips)

    def install(self, dataloader: type) -> None:
        for cls in _subclasses(dataloader):
            self._wrap(cls)
        self._watch_subclasses(dataloader)
        if _ACCELERATE in sys.modules:
            self._accelerate()
        else:
            self._finder = _AfterImport(_ACCELERATE, self._accelerate)
            sys.meta_path.insert(0, self._finder)

    def remove(self) -> None:
        if self._finder is not None:
            self._finder.drop()
            self._finder = None
        while self._undo:
            self._undo.pop()()

    def _accelerate(self) -> None:
        adapter = getattr(sys.modules.get(_ACCELERATE), "DataLoaderAdapter", None)
        if isinstance(adapter, type):
            for cls in _subclasses(adapter):
                self._wrap(cls)

    def _watch_subclasses(self, dataloader: type) -> None:
        """DataLoader subclasses defined from now on are wrapped as they are made."""
        own = dataloader.__dict__.get("__init_subclass__")
        base: Any = dataloader
        wrap, failed = self._wrap, self._hooks[4]

        def __init_subclass__(cls: Any, /, **kwargs: Any) -> None:
            if own is None:
                super(base, cls).__init_subclass__(**kwargs)
            else:
                own.__get__(None, cls)(**kwargs)
            try:
                wrap(cls)
            except Exception as exc:  # never into the user's class statement
                failed(exc)

        setattr(dataloader, "__init_subclass__", classmethod(__init_subclass__))  # noqa: B010

        def restore() -> None:
            if own is None:
                delattr(dataloader, "__init_subclass__")
            else:
                setattr(dataloader, "__init_subclass__", own)  # noqa: B010

        self._undo.append(restore)

    def _wrap(self, cls: type) -> None:
        original = cls.__dict__.get("__iter__")
        if not inspect.isgeneratorfunction(original) or getattr(original, "_otelprof_outer", False):
            return
        wrapper = _outer(original, *self._hooks)
        setattr(cls, "__iter__", wrapper)  # noqa: B010  # a dunder set on a class we do not own
        self.wrappers.append(wrapper)

        def restore() -> None:
            if cls.__dict__.get("__iter__") is wrapper:
                setattr(cls, "__iter__", original)  # noqa: B010

        self._undo.append(restore)


def _subclasses(base: type) -> list[type]:
    found: list[type] = []
    stack = [base]
    while stack:
        sub: type
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                stack.append(sub)
    return found


def fetched(batch: Any, exhausted: bool, end_data: Any, data_end: Any, sizes: Sizes, failed: Any) -> None:
    """A fetch is over: the loader is exhausted (or raised), else the batch's sizes end it."""
    if exhausted:
        end_data()
        return
    try:
        samples, tokens = sizes(batch)
    except Exception as exc:
        failed(exc)
        samples = tokens = None
    data_end(samples, tokens)


def _outer(
    original: Callable[..., Generator[Any, Any, Any]],
    begin_data: Any,
    end_data: Any,
    data_end: Any,
    sizes: Sizes,
    failed: Any,
) -> Callable[..., Iterator[Any]]:
    @functools.wraps(original)
    def __iter__(loader: Any) -> Iterator[Any]:
        inner = original(loader)
        inside = INSIDE
        try:
            while True:
                if inside.depth:  # taken by another outer loader's fetch: that one counts
                    try:
                        batch = next(inner)
                    except StopIteration:
                        return
                    yield batch
                    continue
                begin_data()
                inside.depth += 1
                batch = _NO_BATCH
                try:
                    batch = next(inner)
                except StopIteration:
                    return
                finally:
                    inside.depth -= 1
                    fetched(batch, batch is _NO_BATCH, end_data, data_end, sizes, failed)
                yield batch
        finally:
            inner.close()

    __iter__._otelprof_outer = True  # type: ignore[attr-defined]
    return __iter__
