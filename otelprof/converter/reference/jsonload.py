"""JSON parsing that keeps every number's exact text, as the native reader does.

Floats stay ``RawNumber`` strings so timestamps convert to integer nanoseconds with
no binary-float drift, and re-rendered values match the native renderer byte for byte.
"""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from ...otlp._text import clean
from .._errors import TraceFormatError

_I64_MAX = 2**63 - 1


class RawNumber(str):
    """A JSON number literal that was not a plain integer (kept as its source text)."""

    __slots__ = ()


def _reject_constant(name: str) -> Any:
    raise TraceFormatError(f"invalid JSON: {name} is not a JSON number")


#: Containers nested deeper than this are rejected (the native parser's limit).
MAX_DEPTH = 512


def _check_depth(doc: Any) -> None:
    """Iteratively: a recursive walk would itself hit Python's recursion limit."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            if depth > MAX_DEPTH:
                raise TraceFormatError(f"invalid JSON: nested too deeply (over {MAX_DEPTH} levels)")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))


def loads(text: bytes | bytearray) -> Any:
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"trace is not valid UTF-8 (byte {exc.start})") from None
    try:
        doc = json.loads(decoded, parse_float=RawNumber, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise TraceFormatError("invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. integer literals beyond Python's digit limit
        raise TraceFormatError(f"invalid JSON: {exc}") from None
    _check_depth(doc)
    return doc


def is_number(value: Any) -> bool:
    return isinstance(value, RawNumber) or (isinstance(value, int) and not isinstance(value, bool))


def as_int64(value: Any) -> int | None:
    """An integer literal within int64, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and -_I64_MAX - 1 <= value <= _I64_MAX:
        return value
    return None


def as_double(value: Any) -> float | None:
    if isinstance(value, RawNumber):
        result = float(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > 10**308:
            return None
        result = float(value)
    else:
        return None
    return result if result == result and result not in (float("inf"), float("-inf")) else None


def micros_to_ns(value: Any, where: str) -> int:
    """Exact ``round_half_away(value * 1000)`` of a JSON number of microseconds."""
    if not is_number(value):
        raise TraceFormatError(f"{where}: expected a number, got {_type_name(value)}")
    try:
        d = Decimal(str(value))
    except InvalidOperation:  # pragma: no cover - json only yields valid literals
        raise TraceFormatError(f"{where}: invalid number {value!r}") from None
    if d.is_zero():
        return 0
    if d.adjusted() > 15:
        raise TraceFormatError(f"{where}: {value} microseconds is out of range")
    if d.adjusted() < -30:
        return 0
    return int((d * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str) and not isinstance(value, RawNumber):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "number"


type_name = _type_name


def _render_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, RawNumber):
        return str.__str__(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(clean(value), ensure_ascii=False)


def render(value: Any) -> str:
    """Canonical compact JSON text of a parsed value (mirrors the native renderer).

    Iterative, so values nested up to ``MAX_DEPTH`` render without recursion limits.
    """
    out: list[str] = []
    stack: list[Any] = [value]  # values to render, or literal text (as _Text) to emit
    while stack:
        item = stack.pop()
        if isinstance(item, _Text):
            out.append(item.text)
        elif isinstance(item, list):
            parts: list[Any] = [_Text("[")]
            for k, child in enumerate(item):
                if k:
                    parts.append(_Text(","))
                parts.append(child)
            parts.append(_Text("]"))
            stack.extend(reversed(parts))
        elif isinstance(item, dict):
            parts = [_Text("{")]
            for k, (key, child) in enumerate(item.items()):
                parts.append(_Text(("," if k else "") + json.dumps(clean(key), ensure_ascii=False) + ":"))
                parts.append(child)
            parts.append(_Text("}"))
            stack.extend(reversed(parts))
        else:
            out.append(_render_scalar(item))
    return "".join(out)


class _Text:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text
