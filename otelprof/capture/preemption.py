"""SIGTERM, the way Kubernetes, Slurm and torchelastic preempt a job: what otelprof holds is
delivered or spooled within a bounded grace, then the process ends exactly as it would have.

Installed by ``instrument()`` on the main thread, only over Python's default disposition or a
handler of the program's own (an ignored SIGTERM and a handler installed from C are left alone).
On SIGTERM:

- default disposition: a profiling window in progress stops here, on the main thread (torch's
  profiler state is the thread's that started it), then the session closes on a thread of its
  own (the interrupted frame may hold one of otelprof's locks, so the handler only waits, up to
  the grace), then SIGTERM is raised
  again with the default disposition: the process dies of it, exit status 143, as without
  otelprof. A second SIGTERM during the grace ends it at once.
- the program's own handler (installed before otelprof): it is called at once and decides
  whether and when the process ends; otelprof only wakes its senders (at exit the session
  closes as always).
- otelprof's handler replaced by one that calls it (Lightning composes handlers that way): the
  caller decides, as above; otelprof does not end the process.
- a forked child (a DataLoader worker, a launcher's child): the disposition it inherited from
  before otelprof applies, without a grace.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

_log = logging.getLogger(__name__)

#: After the grace, the exporter gets this long to spool what it still holds (the closing thread
#: may be stuck behind a lock the interrupted frame holds).
LAST_SPOOL_S = 1.0


class Preemption:
    """``stop()`` runs on the signal's thread first; ``close(grace_s)`` closes the session within
    ``grace_s`` on another; ``spool(wait_s)`` is the last resort when it has not returned by then;
    ``wake()`` nudges the senders."""

    def __init__(
        self,
        grace_s: float,
        *,
        stop: Callable[[], None],
        close: Callable[[float], None],
        spool: Callable[[float], None],
        wake: Callable[[], None],
    ) -> None:
        self.grace_s = grace_s
        self._stop, self._close, self._spool, self._wake = stop, close, spool, wake
        self._previous: Any = None
        self._installed = False
        self._closing = False
        self._pid = os.getpid()

    def install(self) -> bool:
        """True when installed (main thread, and SIGTERM is not ignored or handled in C)."""
        if self.grace_s <= 0 or threading.current_thread() is not threading.main_thread():
            return False
        previous = signal.getsignal(signal.SIGTERM)
        if previous is None or previous == signal.SIG_IGN:
            return False
        self._previous = previous
        signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Puts the previous handler back, unless the program has replaced otelprof's since."""
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._installed = False
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous
        if os.getpid() != self._pid:  # a forked child: as it would have been without otelprof
            self._as_before(signum, frame, previous)
            return
        if signal.getsignal(signum) != self._handle or previous != signal.SIG_DFL:
            self._wake()  # another handler decides whether the process ends
            if callable(previous):
                previous(signum, frame)
            return
        if not self._closing:
            self._closing = True
            self._close_within_grace()
        # a second SIGTERM during the grace lands here too: the operator insists
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    def _close_within_grace(self) -> None:
        _log.warning(
            "otelprof: SIGTERM: delivering or spooling the last steps (at most %.3g s), then exiting as SIGTERM does",
            self.grace_s,
        )
        start = time.monotonic()
        try:
            self._stop()
        except Exception:
            _log.warning("otelprof: stopping the profiling window at SIGTERM failed", exc_info=True)
        closer = threading.Thread(target=self._close_quietly, name="otelprof-preempt", daemon=True)
        closer.start()
        closer.join(self.grace_s)
        if closer.is_alive():
            _log.warning("otelprof: SIGTERM grace of %.3g s is over: spooling what is still queued", self.grace_s)
            self._spool(LAST_SPOOL_S)
        _log.info("otelprof: closed %.2f s after SIGTERM", time.monotonic() - start)

    def _close_quietly(self) -> None:
        try:
            self._close(self.grace_s)
        except Exception:  # the process ends anyway: say why its data may be incomplete
            _log.warning("otelprof: closing at SIGTERM failed", exc_info=True)

    @staticmethod
    def _as_before(signum: int, frame: FrameType | None, previous: Any) -> None:
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, previous)
        signal.raise_signal(signum)
