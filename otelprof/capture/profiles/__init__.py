"""Flame graphs of ``with_stack`` windows: stack samples (``stacks.py``) sent as an OTLP profile
and written as pprof and collapsed stacks beside the kept trace (``encode.py``). Run by the
conversion thread (``windows/conversions.py``) after the window's spans are submitted."""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ...converter import ConvertOptions, LiveStep
from ...export.config import profiles_config
from ...export.exporter import Exporter
from ...settings import value
from ...settings.variables import OTELPROF_PROFILES_EXPORT
from ..windows.keep import TraceKeeper

if TYPE_CHECKING:
    from .stacks import Samples

_log = logging.getLogger(__name__)

#: the spool's folder for profiles: records there are never replayed as traces
SPOOL_SUBDIR = "profiles"
#: The largest saved window whose stacks are made: the pass reads the whole JSON into memory
#: (natively ~1.2x its size; the Python reference ~10x, at ~10 us per event), so a bigger window
#: is skipped (logged once, counted in ``skipped``) rather than take gigabytes of the process.
MAX_TRACE_BYTES = 128 * 1024 * 1024


class WindowProfiles:
    """What one ``with_stack`` window becomes besides its spans. ``submit`` takes an
    ``ExportProfilesServiceRequest`` (None: nothing sent); files go beside the kept trace."""

    def __init__(self, submit: Callable[[bytes], None] | None, keeper: TraceKeeper | None) -> None:
        self.submit = submit
        self.keeper = keeper
        self.done = 0
        self.failed = 0
        self.skipped = 0  # windows over MAX_TRACE_BYTES
        self.files: list[Path] = []  # the last window's files
        self.seconds: deque[float] = deque(maxlen=16)  # each window's time here (benchmarks/profiles.py)
        self._warned = False

    def window(
        self, trace: Path, live: tuple[LiveStep, ...], kept: Path | None, options: ConvertOptions, window: str
    ) -> None:
        """Never raises: a window whose stacks fail is logged once and counted."""
        if self.submit is None and (kept is None or self.keeper is None):
            return  # nothing would take it
        start = time.perf_counter()
        try:
            # here, on the conversion thread: never at the first step, inside a user's with_stack profile
            from . import encode, stacks

            if trace.stat().st_size > MAX_TRACE_BYTES:
                self.skipped += 1
                if self.skipped == 1:
                    _log.warning(
                        "otelprof: a with_stack window's trace is over %d MiB: no profile is made for it (nor "
                        "for larger ones; shorten OTELPROF_PROFILE_ACTIVE)",
                        MAX_TRACE_BYTES >> 20,
                    )
                return
            found = stacks.samples_from_file(str(trace), options.base_time_ns)
            if self.submit is not None:
                steps = {step.number: step for step in live}
                resource = list(options.resource_attributes)
                self.submit(encode.otlp_request(found, steps, resource, options.scope_version, window))
            self.files = self._write(found, kept)
            self.done += 1
            self.seconds.append(time.perf_counter() - start)
        except Exception:
            self.failed += 1
            if not self._warned:
                self._warned = True
                _log.warning("otelprof: a window's stack profile failed (further ones counted)", exc_info=True)

    def _write(self, found: Samples, kept: Path | None) -> list[Path]:
        if kept is None or self.keeper is None:
            return []
        from . import encode, stacks

        files = [
            (".pprof.gz", encode.pprof(found)),
            (".collapsed.txt", stacks.collapsed(found.cpu.items()).encode()),
        ]
        if found.device:
            files.append((".device.collapsed.txt", stacks.collapsed(found.device.items()).encode()))
        written = [self.keeper.keep_beside(kept, suffix, data) for suffix, data in files]
        return [path for path in written if path is not None]


def export_enabled(environ: Mapping[str, str]) -> bool:
    """``OTELPROF_PROFILES_EXPORT``: whether profiles are sent (the files follow the kept traces)."""
    return bool(value(environ, OTELPROF_PROFILES_EXPORT, _log))


def exporter(traces: Exporter, environ: Mapping[str, str] = os.environ) -> Exporter:
    """The profiles signal's exporter: the traces exporter's rules (queue, retries, spool,
    destination) for the profiles endpoint, spooling into ``profiles/`` of the traces spool, its
    health in the traces exporter's registry as ``signal="profiles"`` series."""
    config = profiles_config(traces.config, environ)
    spool_dir = traces.spool.directory / SPOOL_SUBDIR
    return Exporter(config, spool_dir=spool_dir, registry=traces.registry, signal="profiles")


__all__ = ["WindowProfiles", "export_enabled", "exporter"]
