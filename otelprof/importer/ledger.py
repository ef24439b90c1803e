"""The import ledger: how many of each file's requests were confirmed delivered (sent to the
backend, or written to the spool, which sends them later), so ``--resume`` sends the rest.

One JSON file, rewritten atomically (temp file, fsync, rename) after every confirmed batch; a
crash leaves the previous complete version. A file's entry is trusted only while the file
(size, modification time), the conversion options and the converted requests (digest) are
unchanged; otherwise that file starts over.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..otlp.file import atomic_writer

VERSION = 1
_CRC_PREFIX = "c1:"


class LedgerError(ValueError):
    """The ledger file exists but cannot be used."""


@dataclass
class Entry:
    size: int
    mtime_ns: int
    options: str  # fingerprint of the conversion options
    digest: str  # digest() of the file's requests
    requests: int
    sent: int

    @property
    def complete(self) -> bool:
        return self.sent >= self.requests


def default_path(paths: Sequence[str | os.PathLike[str]]) -> Path:
    """``~/.cache/otelprof/imports/<hash of the resolved PATH arguments>.json``: the same
    command line finds the same ledger."""
    key = "\n".join(sorted(str(Path(p).resolve()) for p in paths))
    return (
        Path.home()
        / ".cache"
        / "otelprof"
        / "imports"
        / f"{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}.json"
    )


def digest(requests: Sequence[bytes], like: str = "") -> str:
    """What the file's requests were, to tell on ``--resume`` whether a new conversion made the
    same ones: ``c1:`` then sha256 over each request's length and CRC-32. A change detector for
    our own converter's output, not a security boundary: CRC-32 runs at ~5 GB/s where sha256 over
    the bytes ran at ~1.9 (the largest share of an import's own CPU beside conversion). ``like``:
    an entry's stored digest; one written before ``c1:`` is compared as it was made (sha256 over
    the lengths and bytes), so a ledger from an earlier version still resumes."""
    h = hashlib.sha256()
    if like and not like.startswith(_CRC_PREFIX):
        for request in requests:
            h.update(len(request).to_bytes(8, "little"))
            h.update(request)
        return h.hexdigest()
    for request in requests:
        h.update(len(request).to_bytes(8, "little") + zlib.crc32(request).to_bytes(4, "little"))
    return _CRC_PREFIX + h.hexdigest()


def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class Ledger:
    def __init__(self, path: Path, entries: dict[str, Entry] | None = None) -> None:
        self.path = path
        self.entries: dict[str, Entry] = entries or {}

    @classmethod
    def load(cls, path: Path) -> Ledger:
        """The ledger at ``path``; empty when there is none yet."""
        try:
            doc = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            raise LedgerError(
                f"{path}: unreadable import ledger ({exc}); delete it or import without --resume"
            ) from None
        if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("files"), dict):
            raise LedgerError(
                f"{path}: not an otelprof import ledger (version {VERSION}); delete it or import without --resume"
            )
        try:
            entries = {str(k): Entry(**v) for k, v in doc["files"].items()}
        except TypeError as exc:
            raise LedgerError(f"{path}: malformed import ledger entry ({exc})") from None
        return cls(path, entries)

    def get(self, key: str, size: int, mtime_ns: int, options: str) -> Entry | None:
        """The entry for a file if it still describes the same file converted the same way."""
        entry = self.entries.get(key)
        if entry is None or (entry.size, entry.mtime_ns, entry.options) != (size, mtime_ns, options):
            return None
        return entry

    def record(self, key: str, entry: Entry) -> None:
        self.entries[key] = entry
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": VERSION, "files": {k: asdict(v) for k, v in sorted(self.entries.items())}}
        with atomic_writer(self.path) as stream:
            stream.write(json.dumps(doc, indent=1).encode("utf-8"))


__all__ = ["Entry", "Ledger", "LedgerError", "default_path", "digest", "fingerprint"]
