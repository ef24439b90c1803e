"""Files of OTLP messages: length-delimited protobuf streams, and atomic output.

A length-delimited stream is what protobuf's ``writeDelimitedTo`` / ``parseDelimitedFrom``
use: each message is preceded by its size as a base-128 varint, messages back to back, no
header. ``otelprof convert --format otlp-proto`` writes ``ExportTraceServiceRequest``
messages this way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

#: Protobuf refuses messages of 2 GiB or more.
MAX_MESSAGE_BYTES = 2**31 - 1

PathLike = str | os.PathLike[str]


def encode_varint(value: int) -> bytes:
    """Base-128 varint of a non-negative integer (protobuf's encoding of a length)."""
    if value < 0:
        raise ValueError(f"varint of a negative number: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, position after it); ``ValueError`` when truncated or longer than 10 bytes."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    raise ValueError(f"truncated or malformed length prefix at byte {pos}")


def write_delimited(stream: BinaryIO, messages: Iterable[bytes]) -> int:
    """Write each message with its varint length prefix; returns the bytes written."""
    written = 0
    for message in messages:
        if len(message) > MAX_MESSAGE_BYTES:
            raise ValueError(f"message of {len(message)} bytes is larger than protobuf allows")
        prefix = encode_varint(len(message))
        stream.write(prefix)
        stream.write(message)
        written += len(prefix) + len(message)
    return written


def iter_delimited(data: bytes | memoryview) -> Iterator[bytes]:
    """The messages of a length-delimited stream; ``ValueError`` if it is cut short."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        size, start = decode_varint(view, pos)
        end = start + size
        if end > len(view):
            raise ValueError(f"message at byte {pos} needs {size} bytes, {len(view) - start} left")
        yield bytes(view[start:end])
        pos = end


def read_delimited_file(path: PathLike) -> list[bytes]:
    """All messages of a length-delimited file."""
    return list(iter_delimited(Path(path).read_bytes()))


@contextmanager
def atomic_writer(path: PathLike) -> Iterator[BinaryIO]:
    """A binary file that appears at ``path`` complete or not at all.

    Writes go to a hidden temporary file in the same directory, which is flushed, synced and
    renamed over ``path`` when the block ends normally, and removed when it raises.
    An ``OSError`` of the file itself (no such folder, no permission, a full disk) names
    ``path``, never the temporary file, which the user did not ask for.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is not None and os.fspath(exc.filename) == os.fspath(tmp):
            raise _naming(exc, path) from None
        raise


def _naming(exc: OSError, path: PathLike) -> OSError:
    """The same error (same class, errno and message) about ``path``."""
    return type(exc)(exc.errno, exc.strerror, os.fspath(path))


def write_delimited_file(path: PathLike, messages: Iterable[bytes]) -> int:
    """Atomically write a length-delimited file; returns its size in bytes."""
    with atomic_writer(path) as stream:
        return write_delimited(stream, messages)


__all__ = [
    "atomic_writer",
    "encode_varint",
    "iter_delimited",
    "read_delimited_file",
    "write_delimited",
    "write_delimited_file",
]
