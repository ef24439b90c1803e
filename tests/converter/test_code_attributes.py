"""python_function spans carry OpenTelemetry's code.* attributes, read from Kineto's frame name
``path(line): function``: the same in both engines (property-tested on names built to sit on
and beside the rule's edges) and equal to the frame's parts."""

from __future__ import annotations

import gzip
import json

import pytest
from converter_helpers import decode, shared_trace, skip_unless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.converter import ConvertOptions, convert_bytes

CODE_KEYS = ("code.function.name", "code.file.path", "code.line.number")


def _trace(names: list[str]) -> bytes:
    events = [
        {"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": 1_000 + 10 * k, "dur": 5}
        for k, name in enumerate(names)
    ]
    return json.dumps({"traceEvents": events}).encode()


def _convert(names: list[str], engine: str) -> list[bytes]:
    return convert_bytes(_trace(names), ConvertOptions(detail="full", run_id="code"), engine).requests


def _code(names: list[str]) -> dict[str, dict[str, object]]:
    result = convert_bytes(_trace(names), ConvertOptions(detail="full", run_id="code"), "reference")
    return {s.event_name: {k: v for k, v in s.attrs.items() if k.startswith("code.")} for s in decode(result).spans}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("torch/nn/modules/module.py(1527): _call_impl", ("_call_impl", "torch/nn/modules/module.py", 1527)),
        ("train.py(12): <module>", ("<module>", "train.py", 12)),
        ("a (b).py(7): f(x): g", ("f(x): g", "a (b).py", 7)),  # the first "): " splits, the last "(" before it
        ("<frozen runpy>(88): _run_code", ("_run_code", "<frozen runpy>", 88)),
        ("x.py(123456789): f", ("f", "x.py", 123_456_789)),
        ("x.py(1234567890): f", None),  # 10 digits
        ("x.py(): f", None),
        ("x.py(1a): f", None),
        ("(12): f", None),  # no path
        ("x.py(12): ", None),  # no function
        ("x.py(١٢): f", None),  # digits, but not ASCII ones
        ("<built-in method encode of str object at 0x7498f9380cb0>", None),
        ("nn.Module: Linear_0", None),
    ],
)
def test_frame_names_give_their_parts(name: str, expected: tuple[str, str, int] | None) -> None:
    got = _code([name])[name]
    assert got == ({} if expected is None else dict(zip(CODE_KEYS, expected, strict=True)))


_frame = st.builds(
    lambda path, line, func: f"{path}({line}): {func}",
    st.text(max_size=12),
    st.one_of(st.integers(min_value=0, max_value=10**11).map(str), st.text("0123456789a(): ", max_size=6)),
    st.text(max_size=12),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_frame, st.text("ab().: 19\u00e9\U0001f600", max_size=16)), min_size=1, max_size=8))
def test_both_engines_read_frames_alike(names: list[str]) -> None:
    skip_unless_native()
    assert _convert(names, "native") == _convert(names, "reference")


def test_python_function_spans_of_a_real_trace_carry_their_frame() -> None:
    skip_unless_native()
    path = shared_trace("h100")
    result = convert_bytes(gzip.decompress(path.read_bytes()), ConvertOptions(detail="full"), "native")
    frames = [s for s in decode(result).spans if s.category == "python_function" and "code.line.number" in s.attrs]
    assert frames
    for s in frames:
        assert s.name == f"{s.attrs['code.file.path']}({s.attrs['code.line.number']}): {s.attrs['code.function.name']}"
