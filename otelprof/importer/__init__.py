"""``otelprof import``: discovery of trace files and run sets, Nsight Systems SQLite reading,
the resumable ledger and the import loop. The command line is ``otelprof/cli/import_.py``."""

from .discover import KINETO, NSYS, Source, SourceError, find_sources
from .ledger import Ledger, LedgerError
from .nsys import convert_nsys
from .session import Importer, Report, convert_source

__all__ = [
    "KINETO",
    "NSYS",
    "Importer",
    "Ledger",
    "LedgerError",
    "Report",
    "Source",
    "SourceError",
    "convert_nsys",
    "convert_source",
    "find_sources",
]
