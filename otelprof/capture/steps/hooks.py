"""The torch hooks that report a training loop's activity to a StepTracker.

- data: ``_BaseDataLoaderIter.__next__`` (every DataLoader, any number of workers), or, for a
  loader that wraps one in a generator and fetches ahead (accelerate's), what that loader yields
  (loaders.py);
- forward: hooks on the root modules: those with parameters called outside any other module's
  forward (a loss module, having no parameters, is not a root: its time is no forward phase).
  Global module hooks find the roots during the first step and again every ``REDISCOVER_STEPS``
  steps, then give way to hooks on the roots alone: a global hook sends every module call of
  every model through torch's slow hook path, which costs several percent of a small model's
  step (benchmarks/overhead.py), while a root's hooks cost one slow call per forward;
  A module called inside the autograd engine (activation checkpointing recomputing it during
  backward, on the training thread or a device thread) is never a root;
- backward: ``torch.autograd.backward`` (what ``Tensor.backward`` calls);
- optimizer: the global optimizer step pre/post hooks, and ``GradScaler.step`` (``torch.amp``'s,
  which ``torch.cuda.amp``'s inherits): its optimizer phase opens at the scaler's step, so an
  update the scaler skips (inf/NaN gradients: ``optimizer.step()`` is never called) still ends
  a step, marked skipped (``end_update``).

torch.compile (dynamo.py): discovery ends when dynamo starts compiling, before it reads any
hook, and does not come back (global hooks would be guarded by every compiled graph); the hooks
are no-ops inside compiled regions. A compiled model (``torch.compile(model)``) is a root like
any other, its forward timed around the compiled call (also when compiled after its model was
hooked: the OptimizedModule on the stack at the compile becomes a root); a forward inside a compiled function is
not timed (a hook there would break the graph), nor is an optimizer step compiled into one: a
loop whose ``optimizer.step()`` is compiled marks its steps with ``otelprof.step()``.

Everything installed is recorded in ``TorchHooks`` and undone by ``remove()``. A hook never
raises into the loop: a failure is logged once and the hook goes quiet.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .dynamo import DynamoHooks
from .loaders import INSIDE, OuterLoaders, fetched
from .native_tracker import NativeStepTracker
from .step import HOOKS
from .tracker import StepTracker

_log = logging.getLogger(__name__)
#: Global hooks come back for one step this often, to find models first called later.
REDISCOVER_STEPS = 1000
_COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"
#: Roots hooked at most (a loop calling ever new modules at top level must not grow this).
MAX_ROOTS = 64


def batch_size(batch: Any) -> tuple[int | None, int | None]:
    """(samples, tokens) of a batch: the first tensor's leading dimension; tokens when that
    tensor holds integer ids of shape (batch, sequence)."""
    import torch

    tensor = torch.Tensor
    item: Any = batch
    if type(item) in (list, tuple) and item:  # the usual (inputs, targets): no walk needed
        item = item[0]
    if not isinstance(item, tensor):
        item = None
        seen = 0
        stack = [batch]
        while stack and seen < 64:  # bounded walk: batches can be deep structures
            node = stack.pop(0)
            seen += 1
            if isinstance(node, tensor):
                item = node
                break
            if isinstance(node, dict):
                stack.extend(node.values())
            elif isinstance(node, (list, tuple)):
                stack.extend(node)
        if item is None:
            return None, None
    shape = item.shape
    if not shape:
        return None, None
    if len(shape) == 2 and item.dtype in _id_dtypes(torch):
        return shape[0], shape[0] * shape[1]
    return shape[0], None


_ID_DTYPES: frozenset[Any] = frozenset()


def _id_dtypes(torch: Any) -> frozenset[Any]:
    """The integer dtypes token ids come in."""
    global _ID_DTYPES
    if not _ID_DTYPES:
        names = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
        _ID_DTYPES = frozenset(getattr(torch, n) for n in names if hasattr(torch, n))
    return _ID_DTYPES


class TorchHooks:
    """The optimizer and root-module hooks are the tracker's own (C functions with the native
    tracker: no Python frame per event); backward and the DataLoader need a wrapper each."""

    def __init__(self, tracker: StepTracker | NativeStepTracker) -> None:
        self._tracker = tracker
        self._undo: list[Callable[[], None]] = []
        self.forward: RootForwardHooks | None = None

    def install(self) -> None:
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim
        from torch.utils.data import dataloader

        tracker = self._tracker
        for handle in (
            optim.register_optimizer_step_pre_hook(tracker.begin_optimizer),
            optim.register_optimizer_step_post_hook(tracker.end_optimizer),
        ):
            self._undo.append(handle.remove)
        forward = self.forward = RootForwardHooks(nn_module, tracker)
        forward.discover()
        self._undo.append(forward.remove)

        original_backward = torch.autograd.backward
        begin_backward, end_backward = tracker.begin_backward, tracker.end_backward

        @functools.wraps(original_backward)
        def backward(*args: Any, **kwargs: Any) -> Any:
            begin_backward()
            try:
                return original_backward(*args, **kwargs)
            finally:
                end_backward()

        self._patch(torch.autograd, "backward", backward)
        scaler_step = self._patch_scaler(tracker)

        iterator = dataloader._BaseDataLoaderIter
        original_next = iterator.__next__
        begin_data, end_data, data_end = tracker.begin_data, tracker.end_data, tracker.data_end
        failed = self._fail
        inside = INSIDE

        @functools.wraps(original_next)
        def next_batch(it: Any) -> Any:
            if inside.depth:  # an outer loader's fetch (loaders.py): counted there
                return original_next(it)
            begin_data()
            batch = None
            try:
                batch = original_next(it)
                return batch
            finally:
                # StopIteration included: the wait for an exhausted iterator was data wait too
                fetched(batch, batch is None, end_data, data_end, batch_size, failed)

        self._patch(iterator, "__next__", next_batch)
        loaders = OuterLoaders(begin_data, end_data, data_end, batch_size, failed)
        loaders.install(dataloader.DataLoader)
        self._undo.append(loaders.remove)

        frames = (
            backward,
            next_batch,
            *scaler_step,
            forward._global_pre,
            forward._global_post,
            tracker.begin_forward,
            tracker.data_end,
        )
        compiled = DynamoHooks([getattr(tracker, n) for n in HOOKS], frames, forward.compile_started)
        compiled.install()
        self._undo.append(compiled.remove)

    def _patch_scaler(self, tracker: StepTracker | NativeStepTracker) -> tuple[Any, ...]:
        """``GradScaler.step(optimizer)`` opens the optimizer phase and ``end_update`` closes it:
        skipped when the optimizer's own step (its hooks, inside) did not run."""
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:  # pragma: no cover - torch < 2.3
            return ()
        original_step = GradScaler.step
        begin_optimizer, end_update = tracker.begin_optimizer, tracker.end_update

        @functools.wraps(original_step)
        def scaler_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            begin_optimizer(optimizer)
            try:
                return original_step(scaler, optimizer, *args, **kwargs)
            finally:
                end_update()

        self._patch(GradScaler, "step", scaler_step)
        return (scaler_step,)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()
        self.forward = None  # a step ending later (finish() at uninstrument) must not re-hook

    def step_done(self) -> None:
        """A step ended (training thread): the forward hooks move to the roots found."""
        if self.forward is not None and not self._tracker.failed:
            try:
                self.forward.step_done()
            except Exception as exc:
                self._fail(exc)

    def no_steps(self) -> None:
        """Forwards run but nothing ends a step (the tracker's hint): step_done() may never come,
        so the forward hooks move to the roots found without it."""
        if self.forward is not None:
            self.forward.hand_over()

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)

        def restore() -> None:
            if getattr(owner, name) is replacement:  # someone patched over us: leave theirs
                setattr(owner, name, original)

        self._undo.append(restore)

    def _fail(self, exc: BaseException) -> None:
        """An internal error: the tracker stops, so every hook goes quiet (they stay installed
        until remove(): a hook list must not change while torch iterates it); logged once by
        ``log_failure``, the tracker's on_error."""
        self._tracker.fail(exc)


class RootForwardHooks:
    """The forward phase from the outermost module calls, hooked on the root modules only.

    A root is a module with parameters called outside any other module's forward: a loss or
    metric module called after the model is not one (its time is in no phase), so a step
    has one forward phase per model call (several with gradient accumulation, or for each of
    a GAN's models)."""

    def __init__(self, nn_module: Any, tracker: StepTracker | NativeStepTracker) -> None:
        self._nn = nn_module
        # -1 outside the autograd engine: a module called inside it is recomputed (checkpointing)
        self._graph_task: Callable[[], int] | None = _graph_task_id()
        self._root_pre = tracker.begin_forward
        self._root_post = tracker.end_forward
        self._local = threading.local()  # module-call depth per thread (DataParallel replicas)
        self._global: list[Any] = []  # handles of the global hooks while discovering
        self._roots: dict[int, tuple[weakref.ref[Any], list[Any]]] = {}  # id -> (module, handles)
        self._found: dict[int, weakref.ref[Any]] = {}
        self._quiet: Callable[[], None] | None = None
        self._hand_over = False  # hand_over(): the roots take over at the next outermost call
        self._steps = 0
        self.discoveries = 0
        self.compiled = False  # dynamo has compiled something: no more discovery
        self._paused = False  # discovery's hooks are out while a user's with_stack profile runs

    @property
    def discovering(self) -> bool:
        return bool(self._global)

    def roots(self) -> list[Any]:
        return [m for ref, _ in self._roots.values() if (m := ref()) is not None]

    def discover(self) -> None:
        """Global hooks for the next step: they time the forward and note the roots."""
        self.discoveries += 1
        self._local.depth = 0
        self._found.clear()
        self._unhook_roots()  # the global hooks see the roots' calls too: no double count
        self._quiet = _quiet_compile_warning()
        self._global = [
            self._nn.register_module_forward_pre_hook(self._global_pre),
            _always_called(self._nn.register_module_forward_hook, self._global_post),
        ]

    def step_done(self) -> None:
        self._steps += 1
        if self._global and self._found:
            self._hook_roots()
        elif not self._global and not self.compiled and not self._paused and self._steps % REDISCOVER_STEPS == 0:
            self.discover()

    def hand_over(self) -> None:
        """The roots found take over from the global hooks without a step ending (a loop that
        marks no steps would keep them, and torch's slow hook path for every module call, for
        good): at the next outermost module call, whose hook lists torch has read by then (a
        hook list must not change while torch iterates it)."""
        if self._global:
            self._hand_over = True

    def compile_started(self) -> None:
        """Dynamo begins compiling a frame (before it reads any hook): the roots found so far
        take over at once, a root whose forward is running included (its post hook is read
        after its forward), and discovery never returns."""
        self.compiled = True
        if self._global:
            self._hook_roots()
        self._hook_compiled_root()

    def _hook_compiled_root(self) -> None:
        """A root compiled after its hooks went in (``torch.compile(model)`` later in the run):
        its hooks are no-ops inside the graph, so the OptimizedModule being called now, found on
        the stack, becomes a root, its forward timed around the compiled call from the next
        call on."""
        frame: types.FrameType | None = sys._getframe(1)
        for _ in range(256):  # the compiler's own frames lie between
            if frame is None:
                return
            if frame.f_code.co_name == "_call_impl":
                owner = frame.f_locals.get("self")
                inner = getattr(owner, "_orig_mod", None)
                if inner is not None and id(inner) in self._roots and id(owner) not in self._roots:
                    if len(self._roots) < MAX_ROOTS:
                        self._roots[id(owner)] = (weakref.ref(owner), self._root_hooks(owner))
                    return
            frame = frame.f_back

    def remove(self) -> None:
        self._paused = False  # removed for good: a resume() after this puts nothing back
        self._unhook_global()
        self._unhook_roots()

    def pause(self, _wait_s: float = 0.0) -> None:
        """A user's with_stack profile is about to start: the global discovery hooks (Python
        frames around every module call) come out while it runs; discovery goes on after."""
        if self._global:
            self._unhook_global()
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            if not self.compiled and not self._roots:
                self.discover()

    def _hook_roots(self) -> None:
        self._unhook_global()
        for key, ref in list(self._found.items())[:MAX_ROOTS]:
            module = ref()
            if module is not None:
                self._roots[key] = (ref, self._root_hooks(module))

    def _root_hooks(self, module: Any) -> list[Any]:
        return [
            module.register_forward_pre_hook(self._root_pre),
            _always_called(module.register_forward_hook, self._root_post),
        ]

    def _unhook_global(self) -> None:
        for handle in self._global:
            handle.remove()
        self._global = []
        if self._quiet is not None:
            self._quiet()
            self._quiet = None

    def _unhook_roots(self) -> None:
        for _ref, handles in self._roots.values():
            for handle in handles:
                handle.remove()
        self._roots.clear()

    def _global_pre(self, module: Any, _input: Any) -> None:
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth == 0:
            graph_task = self._graph_task
            root = (graph_task is None or graph_task() == -1) and (id(module) in self._found or _has_parameters(module))
            if root and len(self._found) < MAX_ROOTS:
                self._found.setdefault(id(module), weakref.ref(module))
            if self._hand_over:
                # torch read this call's hooks before this one ran (a copy, since 2.0): the
                # global post hook will not run for it, the module's own post hook (put in
                # now) will, so the forward begins here as it would have
                self._hand_over = False
                self._hook_roots()
                if id(module) in self._roots:
                    self._root_pre(module, _input)
                return
            local.root = root
            if root:
                self._root_pre(module, _input)
        local.depth = depth + 1

    def _global_post(self, _module: Any, _input: Any, _output: Any) -> None:
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth <= 0:  # the call began before the hooks went in
            return
        local.depth = depth - 1
        if depth == 1 and getattr(local, "root", False):
            self._root_post(_module, _input, _output)


def _graph_task_id() -> Callable[[], int] | None:
    """torch's id of the graph task the autograd engine runs on this thread (-1: none)."""
    torch_c = getattr(sys.modules.get("torch"), "_C", None)
    found = getattr(torch_c, "_current_graph_task_id", None)
    return found if callable(found) else None


def _has_parameters(module: Any) -> bool:
    try:
        return next(iter(module.parameters()), None) is not None
    except Exception:  # an odd module: treated as a model
        return True


def _quiet_compile_warning() -> Callable[[], None]:
    """torch.compile warns that global module hooks fire once more for its wrapper module:
    ours count the outermost call only, so the warning (which would reach the user's log at
    every discovery step) says nothing true about otelprof. Filtered while discovering only;
    returns what removes the filter."""
    warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
    entry = warnings.filters[0]

    def restore() -> None:
        filters: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at runtime
        with contextlib.suppress(ValueError):
            filters.remove(entry)
            warnings._filters_mutated()  # type: ignore[attr-defined]

    return restore


def _always_called(register: Callable[..., Any], hook: Callable[[Any, Any, Any], None]) -> Any:
    """The post hook runs even when forward raises (torch >= 2.1), so nesting stays balanced."""
    try:
        return register(hook, always_call=True)
    except TypeError:  # pragma: no cover - older torch
        return register(hook)


def log_failure(exc: BaseException) -> None:
    """The trackers' on_error: the one log line of a failure that stopped step tracking."""
    _log.warning("otelprof step tracking stopped after an internal error", exc_info=exc)
