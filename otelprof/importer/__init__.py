"""``otelprof import``: discovery of trace files and run sets, Nsight Systems SQLite reading,
the resumable ledger and the import loop. The command line is ``otelprof/cli/import_.py``.

The names below are imported on first use: ``otelprof convert`` and ``otelprof summary`` read
``importer.discover`` alone and should not pay for sqlite3 and the Nsight Systems reader."""

TYPE_CHECKING = False  # typing's, without importing typing

if TYPE_CHECKING:
    from .discover import KINETO, NSYS, Source, SourceError, find_sources
    from .ledger import Ledger, LedgerError
    from .nsys import convert_nsys
    from .session import Importer, Report, convert_source

#: Where each name lives: ``otelprof.importer.<module>``.
_MODULES = {
    "KINETO": "discover",
    "NSYS": "discover",
    "Source": "discover",
    "SourceError": "discover",
    "find_sources": "discover",
    "Ledger": "ledger",
    "LedgerError": "ledger",
    "convert_nsys": "nsys",
    "Importer": "session",
    "Report": "session",
    "convert_source": "session",
}


def __getattr__(name: str) -> object:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'otelprof.importer' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)


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
