"""The native JSON parser scans strings a block (16 bytes) at a time and validates UTF-8 as it
goes, instead of in a pass of its own. Whatever falls where in a block (a quote, a backslash, a
control character, a multi-byte character, an invalid byte), the native engine must accept what
the reference accepts, convert it the same, and reject the rest with the reference's message."""

from __future__ import annotations

import json

import pytest
from converter_helpers import skip_unless_native

from otelprof.converter import TraceFormatError, convert

pytestmark = pytest.mark.native


@pytest.fixture(autouse=True)
def _need_native() -> None:
    skip_unless_native()


def _outcome(data: bytes, engine: str) -> tuple[str, object]:
    try:
        result = convert(data, engine=engine, detail="full")
    except TraceFormatError as exc:
        return "error", str(exc)
    return "ok", (result.requests, result.stats)


def _agree(data: bytes, *, message: bool = True) -> None:
    """Both accept and convert alike, or both reject (with the same message, unless `message`
    is False: the reader words some range errors of its own)."""
    native, reference = _outcome(data, "native"), _outcome(data, "reference")
    if not message and native[0] == reference[0] == "error":
        return
    assert native == reference, data


def _trace(name: bytes, *, pad: bytes = b"") -> bytes:
    """A one-event trace whose name is the raw JSON string body `name`, `pad` spaces in front."""
    return (
        b'{"traceEvents": [' + pad + b'{"ph": "X", "cat": "cpu_op", "name": "' + name + b'", "pid": 1, "tid": 2,'
        b' "ts": 10, "dur": 5, "args": {"k": "' + name + b'"}}]}'
    )


# What may sit inside a string body, as raw JSON text.
PIECES = {
    "escape-quote": b'\\"',
    "escape-backslash": b"\\\\",
    "escape-n": b"\\n",
    "escape-u": b"\\u00e9",
    "surrogate-pair": b"\\ud83d\\ude00",
    "lone-surrogate": b"\\ud800",
    "two-byte": "\u00e9".encode(),
    "three-byte": "\u20ac".encode(),
    "four-byte": "\U0001f600".encode(),
    "control": b"\x01",
    "tab": b"\t",
    "del": b"\x7f",
    "bad-escape": b"\\q",
    "bad-u-escape": b"\\u12x4",
    "invalid-lead": b"\xff",
    "lone-continuation": b"\x80",
    "overlong": b"\xc0\xaf",
    "encoded-surrogate": b"\xed\xa0\x80",
    "too-large": b"\xf4\x90\x80\x80",
    "truncated-3": b"\xe2\x82",
    "truncated-4": b"\xf0\x9f\x98",
    "truncated-then-quote": b"\xe2\x82",
}


@pytest.mark.parametrize("piece", sorted(PIECES))
def test_piece_at_every_offset_of_a_block(piece: str) -> None:
    body = PIECES[piece]
    for offset in range(0, 40):
        for after in (b"", b"x" * (33 - offset % 7)):
            _agree(_trace(b"a" * offset + body + after))
            _agree(_trace(b"a" * offset + body + after, pad=b" " * (offset % 5)))


@pytest.mark.parametrize("length", range(0, 70))
def test_plain_strings_of_every_length(length: int) -> None:
    _agree(_trace(bytes(97 + i % 26 for i in range(length))))


def test_non_ascii_text_converts_as_the_reference() -> None:
    text = "".join(chr(c) for c in (0xE9, 0x20AC, 0x1F600, 0x4E2D, 0x41)) * 9
    for cut in range(0, len(text)):
        _agree(_trace(text[:cut].encode()))


def test_string_ending_at_the_end_of_the_input() -> None:
    # every cut of a document ends inside a string, a number, a literal or between tokens
    doc = _trace("caf\u00e9 \\n \u20ac".encode())
    for cut in range(len(doc) - 40, len(doc) + 1):
        _agree(doc[:cut])


@pytest.mark.parametrize(
    "bad",
    [
        b"\xff",  # non-ASCII outside a string: the UTF-8 error wins where it is invalid
        "\u00e9".encode(),  # valid UTF-8 outside a string: a JSON error
        b" \x01",
    ],
)
def test_bytes_outside_strings(bad: bytes) -> None:
    doc = _trace(b"name")
    for at in (1, doc.index(b'"pid"'), doc.index(b"5"), len(doc) - 1, len(doc)):
        _agree(doc[:at] + bad + doc[at:])


def test_utf8_error_after_a_json_error_is_reported_first() -> None:
    # Python decodes the whole text before it parses: a later invalid byte is the error
    _agree(_trace(b"a\x01b") + b"\xff")
    _agree(_trace(b"a\\qb" + b"x" * 40 + b"\xe2\x82"))
    _agree(b'{"traceEvents": [1,]}' + b" " * 20 + b"\xc0\xaf")


def test_json_module_agrees_on_what_is_valid() -> None:
    for piece, body in PIECES.items():
        data = _trace(b"ab" + body)
        try:
            json.loads(data.decode("utf-8"))  # strict, as the converters (not surrogatepass)
            valid = True
        except (ValueError, UnicodeDecodeError):
            valid = False
        native = _outcome(data, "native")
        assert (native[0] == "ok") == valid, piece


def test_args_kept_while_the_document_grows() -> None:
    # args of dense arrays need more nodes than the document reserves up front for its size:
    # the node array moves while events are read, and the events' args must follow it
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": f"k{i}",
            "pid": 1,
            "tid": 7,
            "ts": 10 + i,
            "dur": 1,
            "args": {"grid": [0] * (50 + i), "n": i},
        }
        for i in range(40)
    ]
    events.insert(
        20,
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "pid": 1,
            "tid": 2,
            "ts": 15,
            "args": {"Bytes": [1] * 300, "Total Allocated": 5},
        },
    )
    data = json.dumps({"traceEvents": events}, separators=(",", ":")).encode()
    _agree(data)
    _agree(data[:-1] + b',"baseTimeNanoseconds":1000,"pad":[' + b"0," * 3000 + b"0]}")


# Integers are read up to 8 digits at a time: every length, around the int64 and uint64 limits,
# and followed by every kind of byte that may end a number.
_NUMBERS = [
    *(str(10**n - 1) for n in range(1, 26)),
    *(str(10**n) for n in range(0, 26)),
    *("-" + str(7 * 10**n + 3) for n in range(0, 22)),
    str(2**63 - 1),
    str(2**63),
    str(-(2**63)),
    str(-(2**63) - 1),
    str(2**64 - 1),
    str(2**64),
    str(2**64 + 1),
    "18446744073709551616000",
    "9223372036854775807.5",
    "1669783687464181",
    "1669783687464181.25",
    "1669783687464181e0",
    "1669783687464181E-3",
    "12345678.9",
    "123456789e2",
    "0",
    "-0",
    "0.5",
    "7",
]


@pytest.mark.parametrize("number", _NUMBERS)
def test_numbers_read_as_the_reference(number: str) -> None:
    for field in ("ts", "dur", "args"):
        value = '{"n": ' + number + "}" if field == "args" else number
        event = '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 2, "ts": 10, "dur": 5'
        event = event.replace(
            f'"{field}": ' + {"ts": "10", "dur": "5", "pid": "1"}.get(field, ""), f'"{field}": {value}'
        )
        if field == "args":
            event += ', "args": ' + value
        for tail in ("}", " }", "\n}", ',"x":1}'):
            _agree(('{"traceEvents": [' + event + tail + "]}").encode(), message=field == "args")
    # at the very end of the input, where fewer than 8 bytes remain
    _agree(('{"traceEvents": [], "n": ' + number + "}").encode())
    _agree(number.encode())


@pytest.mark.parametrize("bad", ["01", "-", "--1", "1.", "1.e5", "1e", "1e+", ".5", "+1", "1x", "0x10", "1.5.5"])
def test_malformed_numbers_fail_as_the_reference(bad: str) -> None:
    _agree(('{"traceEvents": [{"ph": "X", "ts": ' + bad + ', "dur": 1}]}').encode())
    _agree(('{"traceEvents": [], "n": ' + bad).encode())


def test_decimal_args_convert_as_the_reference() -> None:
    # args numbers become double attributes: short decimals take an exact fast path, the rest
    # from_chars; both must round as Python's float()
    import random

    rng = random.Random(18)
    values = [
        "0.1",
        "0.3",
        "2.675",
        "4.35",
        "-0.0",
        "0.0",
        "1e22",
        "1e23",
        "1e-22",
        "1e-23",
        "0.1e-21",
        "123456789012345.6",
        "999999999999999",
        "999999999999999.9",
        "9007199254740993.0",
        "1.7976931348623157e308",
        "5e-324",
        "2.2250738585072014e-308",
        "1E+2",
        "1e-005",
        "12.5e3",
        "0.000000000000000000001",
        "100000000000000000000000.0",
        "3.14159265358979",
        "1.00000000000000000",
    ]
    for _ in range(400):
        digits = str(rng.randrange(1, 10 ** rng.randint(1, 17)))
        point = rng.randint(0, len(digits))
        text = digits[:point] + "." + (digits[point:] or "0") if point else "0." + digits
        if rng.random() < 0.3:
            text += f"e{rng.randint(-30, 30)}"
        values.append(("-" if rng.random() < 0.2 else "") + text)
    keys = ("blocks per SM", "warps per SM", "est. achieved occupancy %", "memory bandwidth (GB/s)")
    for start in range(0, len(values), 100):
        chunk = values[start : start + 100]
        events = []
        for k in range(0, len(chunk), 4):
            args = ", ".join(f'"{key}": {v}' for key, v in zip(keys, chunk[k : k + 4], strict=False))
            head = f'"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 7, "ts": {10 + k}, "dur": 1'
            events.append(f'{{{head}, "args": {{{args}}}}}')
        _agree(('{"traceEvents": [' + ", ".join(events) + "]}").encode())
