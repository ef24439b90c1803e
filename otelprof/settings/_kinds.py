"""How a variable's text becomes a value: one parser per kind, in the OpenTelemetry
specification's dialect (``configuration/sdk-environment-variables``).

- empty or unset is the default, never a warning;
- boolean: ``true`` in any case is true, ``false`` in any case is false; anything else is
  unusable (``1``, ``yes`` and ``on`` included: the specification forbids other true values);
- integer: a decimal integer in the variable's range, never past int64 (the native core's option
  fields); number: a decimal number (fractions and exponents allowed, never nan or infinite) the
  variable's check accepts, which bounds it;
- enumeration: one of the known values, in any case;
- names: a comma-separated list of known values, in any case; unknown entries are skipped (one
  warning for all of them) and the known ones kept, as the SDK does for ``OTEL_*_EXPORTER``;
- text: UTF-8 (other bytes reach Python as lone surrogates: unusable); a path may hold any bytes.

A parser raises ``ValueError`` for an unusable value; the registry then logs one warning that
names the variable, the value and what is used instead (``expect`` words the middle of it).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Decimal text only: no ``1_000``, no hex, no non-ASCII digits (Python's int() and float() take them).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
#: The widest integer range: the native core's option fields (and ConvertOptions') are int64.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class PartlyUsable(ValueError):
    """A list value some of whose entries are unusable: ``value`` is what the rest give."""

    def __init__(self, value: Any, bad: list[str]) -> None:
        super().__init__(bad[0])
        self.value, self.bad = value, bad


class Kind:
    """A parser: ``parse`` turns a stripped, non-empty text into the value or raises ValueError."""

    expect = "usable"
    kind = "text"

    def parse(self, raw: str) -> Any:
        return raw

    def show(self, value: Any) -> str:
        """A value as the warning and the tables write it."""
        return str(value)


def is_utf8(raw: str) -> bool:
    """Whether ``raw`` is text: Python decodes environment bytes that are not UTF-8 to lone
    surrogates, which no OTLP string, header, URL or metric label can carry."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Text(Kind):
    """Any UTF-8 text, kept as given (stripped)."""

    expect = "UTF-8 text"

    def parse(self, raw: str) -> str:
        if not is_utf8(raw):
            raise ValueError(raw)
        return raw


class PathKind(Kind):
    """A path; ``~`` expands to the home folder. One no file system takes (a name past 255
    bytes, a path past 4095) is unusable: it would fail at every use instead of once here."""

    kind = "path"

    def parse(self, raw: str) -> Path:
        try:
            path = Path(raw).expanduser()
        except RuntimeError:  # ``~user`` of no such user (or no home at all)
            raise ValueError(raw) from None
        encoded = os.fsencode(path)
        if len(encoded) > 4095 or any(len(name) > 255 for name in encoded.split(b"/")):
            raise ValueError(raw)
        return path


#: A host name's label (RFC 1123): letters, digits and inner hyphens, 63 characters at most;
#: and underscores, which resolvers take (container and service names have them).
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


class Host(Kind):
    """An IP address, or a host name (RFC 1123: 253 characters at most, the last label not all
    digits, RFC 3696): what a socket can be bound to or resolved, never a URL or a path."""

    expect = "an IP address or a host name"

    def parse(self, raw: str) -> str:
        labels = raw.removesuffix(".").split(".")
        name = len(raw) <= 253 and all(_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()
        if not (name or _is_ip_address(raw)):
            raise ValueError(raw)
        try:  # what sockets do with it: an IPv6 zone past 63 characters raised UnicodeError there
            raw.encode("idna")
        except UnicodeError:
            raise ValueError(raw) from None
        return raw


def _is_ip_address(raw: str) -> bool:
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        return False
    return True


class Bool(Kind):
    expect = "true or false"
    kind = "boolean"

    def parse(self, raw: str) -> bool:
        low = raw.lower()
        if low == "true":
            return True
        if low == "false":
            return False
        raise ValueError(raw)

    def show(self, value: Any) -> str:
        return "true" if value else "false"


@dataclass(frozen=True)
class Int(Kind):
    """A decimal integer in [low, high]; both within int64, so every consumer takes it."""

    low: int = 0
    high: int = INT64_MAX
    kind = "integer"

    def __post_init__(self) -> None:
        if not INT64_MIN <= self.low <= self.high <= INT64_MAX:
            raise ValueError(f"Int({self.low}, {self.high}): not an int64 range")

    @property
    def expect(self) -> str:  # type: ignore[override]
        return f"an integer from {self.low} to {self.high}"

    def parse(self, raw: str) -> int:
        # past 19 significant digits it is out of any int64 range: no int() of a long text
        if not _INTEGER.fullmatch(raw) or len(raw.lstrip("+-").lstrip("0")) > 19:
            raise ValueError(raw)
        value = int(raw)
        if not self.low <= value <= self.high:
            raise ValueError(raw)
        return value

    def show(self, value: Any) -> str:
        return f"{value:d}"


@dataclass(frozen=True)
class Number(Kind):
    """A finite decimal number that ``accept`` allows; ``words`` says which, for the warning."""

    accept: Callable[[float], bool]
    words: str
    kind = "number"

    @property
    def expect(self) -> str:  # type: ignore[override]
        return self.words

    def parse(self, raw: str) -> float:
        if not _NUMBER.fullmatch(raw):  # also rejects nan and inf
            raise ValueError(raw)
        value = float(raw)
        if not math.isfinite(value) or not self.accept(value):
            raise ValueError(raw)
        return value

    def show(self, value: Any) -> str:
        return f"{value:g}"


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``values``, in any case; the value is returned in the case given here."""

    values: tuple[str, ...]
    kind = "enum"

    @property
    def expect(self) -> str:  # type: ignore[override]
        return " or ".join(repr(v) for v in self.values)

    def parse(self, raw: str) -> str:
        for value in self.values:
            if raw.lower() == value.lower():
                return value
        raise ValueError(raw)

    def show(self, value: Any) -> str:
        return repr(value)


@dataclass(frozen=True)
class Names(Kind):
    """Comma-separated names out of ``values``, in any case, without repeats, in the order given;
    the value is a tuple of them in the case given here. Unknown entries raise
    :class:`PartlyUsable` carrying the known ones, which the registry uses after one warning."""

    values: tuple[str, ...]
    kind = "list"

    @property
    def expect(self) -> str:  # type: ignore[override]
        return "a comma-separated list of " + ", ".join(repr(v) for v in self.values)

    def parse(self, raw: str) -> tuple[str, ...]:
        by_lower = {v.lower(): v for v in self.values}
        known: list[str] = []
        bad: list[str] = []
        for entry in raw.split(","):
            entry = entry.strip()
            name = by_lower.get(entry.lower())
            if name is None:
                if entry:
                    bad.append(entry)
            elif name not in known:
                known.append(name)
        if bad:
            raise PartlyUsable(tuple(known), bad)
        return tuple(known)

    def show(self, value: Any) -> str:
        return ",".join(value) if value else "none"
