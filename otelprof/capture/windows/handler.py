"""``otelprof.trace_handler()``: the user's own torch.profiler windows, sent as OpenTelemetry spans.

An ``on_trace_ready`` in the manner of torch's ``tensorboard_trace_handler``. The window's
trace is saved on the calling (training) thread, as torch's own handlers do, and converted by
the native core on otelprof's conversion thread. Beside the auto-instrumentor it goes the way
of otelprof's own windows: each ``ProfilerStep#N`` of the user's goes under the live
``train.step`` it ran in (matched by time: the user's profiler numbers its steps itself), with
the session's resource, exporter, spool and limits, counted in
``otelprof_profiling_windows_total{trigger="user"}``. Without a session, the exporter and
conversion options come from the environment (``OTEL_EXPORTER_OTLP_*``, ``OTELPROF_*``), made
at the first window. Nothing raises into the loop: a failure is logged once and counted.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import logging
import os
import shutil
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .conversions import Conversions, Job, temp_path

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_standalone: Conversions | None = None
_warned = False

Handler = Callable[[Any], None]


def trace_handler(then: Handler | None = None) -> Handler:
    """An ``on_trace_ready`` for ``torch.profiler.profile`` that sends each window to
    OpenTelemetry. ``then`` (e.g. ``torch.profiler.tensorboard_trace_handler(dir)``) runs first,
    exactly as it would alone: the file it writes is the user's, and otelprof converts a link to
    it. Kineto saves a window only once, so without ``then`` a later ``export_chrome_trace`` of
    the same window (a handler of the user's called after this one) gets a copy of otelprof's."""

    def ready(prof: Any) -> None:
        written: list[str] = []
        if then is not None:
            with _watching_exports(prof, written):
                then(prof)  # the user's handler: its errors are the user's
        try:
            _send(prof, written[-1] if written else None)
        except Exception:
            _failed()

    return ready


@contextlib.contextmanager
def _watching_exports(prof: Any, written: list[str]) -> Iterator[None]:
    """Notes where ``export_chrome_trace`` writes while the user's handler runs."""
    export = prof.export_chrome_trace
    had_own = "export_chrome_trace" in vars(prof)

    def watched(path: Any, *args: Any, **kwargs: Any) -> Any:
        result = export(path, *args, **kwargs)
        written.append(os.fspath(path))
        return result

    prof.export_chrome_trace = watched
    try:
        yield
    finally:
        if had_own:
            prof.export_chrome_trace = export
        else:
            del prof.export_chrome_trace


def _send(prof: Any, written: str | None) -> None:
    from ..session import session

    live = session()
    windows = live.windows if live is not None else None
    path = temp_path(".json.gz" if written is not None and written.endswith(".gz") else ".json")
    try:
        if written is not None:
            _link(Path(written), path)
        else:
            prof.export_chrome_trace(str(path))
            _share_with_later_exports(prof, path)
        if windows is not None:
            windows.convert_user(path)
        else:
            _conversions().put(Job(path, "user"))
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _link(source: Path, path: Path) -> None:
    """``path`` becomes the user's file (a hard link: no copy), or a copy of it."""
    path.unlink(missing_ok=True)
    try:
        os.link(source, path)
    except OSError:
        shutil.copyfile(source, path)


def _share_with_later_exports(prof: Any, path: Path) -> None:
    """Until the profiler's next window, its ``export_chrome_trace`` writes a copy of the trace
    otelprof saved (Kineto refuses a second save: "Trace is already saved")."""
    kept = temp_path(".json")
    _link(path, kept)
    inner = getattr(prof, "profiler", None)
    weakref.finalize(prof, kept.unlink, missing_ok=True)

    def export_chrome_trace(target: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(prof, "profiler", None) is inner and kept.exists():
            target = os.fspath(target)
            if target.endswith(".gz"):
                with open(kept, "rb") as src, gzip.open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copyfile(kept, target)
            return None
        vars(prof).pop("export_chrome_trace", None)  # a new window: torch's own again
        kept.unlink(missing_ok=True)
        return prof.export_chrome_trace(target, *args, **kwargs)

    prof.export_chrome_trace = export_chrome_trace


def _conversions() -> Conversions:
    """Without a session: one exporter and conversion thread for the process, from the
    environment, shut down (flushed, the rest spooled) at exit."""
    global _standalone
    with _lock:
        if _standalone is None:
            from ...export import exporter_config_from_env
            from ...export.exporter import Exporter, spool_dir_from_env
            from ...resource import options_from_env

            exporter = Exporter(exporter_config_from_env(os.environ), spool_dir=spool_dir_from_env(os.environ))
            conversions = Conversions(options_from_env(os.environ), exporter.submit)

            def close() -> None:
                conversions.close()
                exporter.shutdown(5.0)

            atexit.register(close)
            _standalone = conversions
        return _standalone


def _failed() -> None:
    global _warned
    from ..session import session

    live = session()
    if live is not None and live.windows is not None:
        live.windows.conversions.count_failure()
    elif _standalone is not None:
        _standalone.count_failure()
    if not _warned:
        _warned = True
        _log.warning("otelprof.trace_handler: sending a window failed (counted)", exc_info=True)
