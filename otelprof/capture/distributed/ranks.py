"""Ranks of one torch.distributed job: identity, run-id agreement and the straggler ratio.

At the first step (every rank reaches it, at the same point of the same program), when
torch.distributed is initialized with world size > 1:

- rank and world size come from torch.distributed (the launcher's env only gives local rank);
- otelprof creates its own gloo process group (``new_group``, a ``TIMEOUT_S`` timeout), so it
  never queues work on the job's own communicators (NCCL streams, its gloo sequence numbers);
- when no run id came from the environment (:envvar:`OTELPROF_RUN_ID`, the launcher's), rank 0's
  random one is broadcast on that group, so step N of every rank shares one trace.

``new_group`` must be called by every rank in the same order as the job's own ``new_group``
calls: otelprof has to be enabled on all ranks or none (the environment of a launcher is).
Any failure (a rank that never arrives, no gloo) is logged once, keeps this rank's own run
id, and never raises into training.

The straggler ratio (this rank's mean step time over the last K steps / the median of all
ranks' means) costs one non-blocking ``all_gather`` of one float every K steps on that group:
the training thread issues it and moves on; its result is read at a later step or scrape.
Each rank receives ``8 x world size`` bytes per K steps; nothing is added to other steps.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ...settings import value
from ...settings.variables import OTELPROF_RUN_ID, OTELPROF_STRAGGLER_STEPS
from .identity import Identity

_log = logging.getLogger(__name__)

#: Bounds both the group's creation at the first step (ranks arriving late) and each
#: straggler all_gather (a rank that stopped training).
TIMEOUT_S = 120.0
DEFAULT_STRAGGLER_STEPS = 100
#: Intervals issued and not yet complete; more means a rank is far behind or gone: stop.
MAX_PENDING = 4
LABELS = ("run", "rank", "local_rank")


def straggler_steps(environ: Mapping[str, str]) -> int:
    return int(value(environ, OTELPROF_STRAGGLER_STEPS, _log))


def straggler_ratio(mean_s: float, means_s: Iterable[float]) -> float | None:
    """This rank's mean step time over the group's median of the ranks' means."""
    median = statistics.median(means_s)
    return mean_s / median if median > 0 else None


def join(identity: Identity, environ: Mapping[str, str]) -> tuple[Identity, Straggler | None]:
    """Identity as torch.distributed knows it (run id agreed with rank 0 when the environment
    gave none), and the straggler monitor when there is a group. Called on the training thread
    at the first step; never raises."""
    dist = _torch_distributed()
    if dist is None:
        if identity.world_size > 1 and identity.run_id_source == "random":
            _log.warning(
                "no run id shared by the ranks (set %s): each rank's steps get their own traces", OTELPROF_RUN_ID
            )
        return identity, None
    try:
        identity = dataclasses.replace(identity, rank=dist.get_rank(), world_size=dist.get_world_size())
        interval = straggler_steps(environ)
        agree = identity.run_id_source == "random"
        if identity.world_size <= 1 or not (agree or interval):
            return identity, None
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT_S))
        if agree:
            box = [identity.run_id]
            dist.broadcast_object_list(box, src=0, group=group)
            identity = dataclasses.replace(identity, run_id=str(box[0]), run_id_source="torch.distributed")
    except Exception as exc:
        _log.warning(
            "otelprof could not join the torch.distributed job (%s): %s",
            exc.__class__.__name__,
            "this rank's steps get their own traces" if identity.run_id_source == "random" else "no straggler metric",
        )
        return identity, None
    if not interval:
        return identity, None
    return identity, Straggler(dist, group, identity.world_size, interval)


def _torch_distributed() -> Any:
    """torch.distributed when a default process group exists, else None."""
    import sys

    if "torch" not in sys.modules:  # never import torch from here
        return None
    try:
        import torch.distributed as dist

        return dist if dist.is_available() and dist.is_initialized() else None
    except Exception:
        return None


class Straggler:
    """Every ``interval`` steps, one async all_gather of this rank's mean step time."""

    def __init__(self, dist: Any, group: Any, world_size: int, interval: int) -> None:
        self._dist = dist
        self._group = group
        self._world_size = world_size
        self.interval = interval
        self._lock = threading.Lock()
        self._sum = 0.0
        self._count = 0
        self._pending: deque[tuple[Any, Any, float]] = deque()  # (work, output, this rank's mean)
        self._failed = False
        self.ratio: float | None = None
        self.completed = 0  # intervals whose result has been read
        self._collector: _RatioCollector | None = None

    def observe(self, seconds: float) -> None:
        """A step ended (training thread)."""
        with self._lock:
            if self._failed:
                return
            self._sum += seconds
            self._count += 1
            try:
                self._poll()
                if self._count >= self.interval:
                    self._issue(self._sum / self._count)
                    self._sum, self._count = 0.0, 0
            except Exception as exc:
                self._fail(exc)

    def poll(self) -> float | None:
        """Reads finished all_gathers (any thread, e.g. a scrape); the latest ratio."""
        with self._lock:
            if not self._failed:
                try:
                    self._poll()
                except Exception as exc:
                    self._fail(exc)
            return self.ratio

    def register(self, labels: Mapping[str, str], registry: CollectorRegistry) -> None:
        self._collector = _RatioCollector(self, [labels[k] for k in LABELS])
        registry.register(self._collector)

    def unregister(self, registry: CollectorRegistry) -> None:
        if self._collector is not None:
            registry.unregister(self._collector)
            self._collector = None

    def _issue(self, mean: float) -> None:
        import torch

        # torch.autograd's own switch, imported from where torch's stubs declare it
        from torch._C._autograd import _enable_record_function

        if len(self._pending) >= MAX_PENDING:
            raise TimeoutError(f"{MAX_PENDING} straggler exchanges outstanding: a rank is far behind or gone")
        gather = getattr(self._dist, "all_gather_single", None) or self._dist.all_gather_into_tensor
        output = torch.empty(self._world_size, dtype=torch.float64)
        # Record functions off while issuing: gloo's async work keeps a RecordFunction open
        # until it completes on a gloo thread, and when that outlives a profiling window (a late
        # rank) its end is written into the stopped profiler's freed event storage: heap
        # corruption (torch 2.13, plain torch.profiler too). The exchange is otelprof's own
        # work, never the user's operators, so no profiler should see it anyway.
        _enable_record_function(False)
        try:
            work = gather(output, torch.tensor([mean], dtype=torch.float64), group=self._group, async_op=True)
        finally:
            _enable_record_function(True)
        self._pending.append((work, output, mean))

    def _poll(self) -> None:
        while self._pending and self._pending[0][0].is_completed():
            work, output, mean = self._pending.popleft()
            work.wait()  # already complete: returns, or raises the exchange's error
            self.ratio = straggler_ratio(mean, output.tolist())
            self.completed += 1

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        self._pending.clear()
        self.ratio = None
        _log.warning("otelprof: straggler metric stopped (%s: %s)", exc.__class__.__name__, exc)


class _RatioCollector(Collector):
    """``otelprof_straggler_ratio``, present once a first exchange has completed."""

    def __init__(self, straggler: Straggler, labels: list[str]) -> None:
        self._straggler = straggler
        self._labels = labels

    def describe(self) -> Iterable[GaugeMetricFamily]:
        yield _family()  # registering must not poll the exchange

    def collect(self) -> Iterable[GaugeMetricFamily]:
        ratio = self._straggler.poll()
        if ratio is None:
            return
        family = _family()
        family.add_metric(self._labels, ratio)
        yield family


def _family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "otelprof_straggler_ratio",
        "This rank's mean step time over the last interval / the median of all ranks' means.",
        labels=LABELS,
    )
