"""otelprof's own log line format, ``otelprof: LEVEL: message``, for the command line and a
live process alike. Standard library only: ``import otelprof`` installs the last-resort
handler, and that import happens inside every instrumented process's ``import torch``."""

from __future__ import annotations

import logging
import sys


class Formatter(logging.Formatter):
    """``otelprof: LEVEL: message``: the one format of otelprof's own log lines, in the command
    line and in a live process alike."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"otelprof: {record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _LastResort(logging.Handler):
    """Python's last-resort handler (warnings and worse to stderr when nothing else handles a
    record), in otelprof's format: it writes only while no other handler would see the record,
    so an application's (or pytest's) logging configuration decides as soon as it has one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(Formatter())

    def handle(self, record: logging.LogRecord) -> bool:
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return False
            logger = logger.parent if logger.propagate else None
        return bool(super().handle(record))

    def emit(self, record: logging.LogRecord) -> None:
        try:  # sys.stderr as it is now (it may have been replaced), as logging.lastResort does
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


def install_last_resort() -> None:
    """Give the ``otelprof`` logger the last-resort handler above (once per process)."""
    logger = logging.getLogger("otelprof")
    if not any(isinstance(h, _LastResort) for h in logger.handlers):
        logger.addHandler(_LastResort())
