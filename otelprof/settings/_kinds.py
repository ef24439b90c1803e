"""How a variable's text becomes a value: one parser per kind, in the OpenTelemetry
specification's dialect (``configuration/sdk-environment-variables``).

- empty or unset is the default, never a warning;
- boolean: ``true`` in any case is true, ``false`` in any case is false; anything else is
  unusable (``1``, ``yes`` and ``on`` included: the specification forbids other true values);
- integer: a decimal integer in the variable's range; number: a decimal number (fractions and
  exponents allowed, never nan or infinite) the variable's check accepts;
- enumeration: one of the known values, in any case.

A parser raises ``ValueError`` for an unusable value; the registry then logs one warning that
names the variable, the value and what is used instead (``expect`` words the middle of it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Decimal text only: no ``1_000``, no hex, no non-ASCII digits (Python's int() and float() take them).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


class Kind:
    """A parser: ``parse`` turns a stripped, non-empty text into the value or raises ValueError."""

    expect = "usable"
    kind = "text"

    def parse(self, raw: str) -> Any:
        return raw

    def show(self, value: Any) -> str:
        """A value as the warning and the tables write it."""
        return str(value)


class Text(Kind):
    """Any text, kept as given (stripped)."""


class PathKind(Kind):
    """A path; ``~`` expands to the home folder."""

    kind = "path"

    def parse(self, raw: str) -> Path:
        return Path(raw).expanduser()


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
    """A decimal integer in [low, high] (no upper bound when ``high`` is None)."""

    low: int = 0
    high: int | None = None
    kind = "integer"

    @property
    def expect(self) -> str:  # type: ignore[override]
        return f"an integer from {self.low}" + (f" to {self.high}" if self.high is not None else "")

    def parse(self, raw: str) -> int:
        if not _INTEGER.fullmatch(raw):
            raise ValueError(raw)
        value = int(raw)
        if value < self.low or (self.high is not None and value > self.high):
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
