"""The markup ``torch.autograd.profiler.emit_nvtx`` appends to each op's NVTX range text.

Three generations, read from torch's own source:

- torch 2.x (``torch/csrc/profiler/util.cpp`` ``getNvtxStr``)::

      NAME[, seq = N][, op_id = K][, sizes = [[2, 4], []]][, input_op_ids = [(K,OUT), ...]]

  Backward nodes carry ``, seq = M`` too; they are told apart by their enclosing range,
  ``autograd::engine::evaluate_function: NAME`` (see :func:`is_backward`).
- torch 1.2-1.12 (``profiler_legacy.cpp``): ``NAME, seq = N[, sizes = [...]]``; an op with no
  sequence number but with shapes loses its name (``, sizes = [...]``).
- torch 0.4-1.1 (``profiler.cpp``): ``NAME, seq=N`` forward and ``NAME, stashed seq=M`` for a
  backward Function's ``apply()``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

EVALUATE_FUNCTION = "autograd::engine::evaluate_function: "

_SHAPES = r"\[(?:\[(?:-?\d+(?:, -?\d+)*)?\](?:, \[(?:-?\d+(?:, -?\d+)*)?\])*)?\]"
_OP_IDS = r"\[(?:\(\d+,-?\d+\)(?:, \(\d+,-?\d+\))*)?\]"
#: where markup can start; the first such place whose rest is all markup ends the name
_KEY = re.compile(r", (?:stashed seq|seq ?=|op_id = |sizes = |input_op_ids = )")
_MARKUP = re.compile(
    r"(?:, (?P<stashed>stashed )?seq ?= ?(?P<seq>\d+))?"
    r"(?:, op_id = (?P<op_id>\d+))?"
    rf"(?:, sizes = (?P<sizes>{_SHAPES}))?"
    rf"(?:, input_op_ids = (?P<inputs>{_OP_IDS}))?"
)
_PAIR = re.compile(r"\((\d+),(-?\d+)\)")


@dataclass(frozen=True)
class OpMarkup:
    """What an ``emit_nvtx`` range text says about its op."""

    name: str
    sequence_number: int | None
    stashed: bool  # torch <= 1.1: the range of a backward Function's apply()
    op_id: int | None
    input_dims: list[list[int]] | None
    input_op_ids: list[list[int]] | None

    def kineto_args(self, fwd_thread_id: int | None = None) -> list[tuple[str, object]]:
        """The op's Kineto ``args`` (what torch's profiler writes on a ``cpu_op``), for the
        converter: ``Sequence number``, ``Fwd thread id`` (given for a backward op) and
        ``Input Dims``. ``op_id`` and ``input_op_ids`` have no Kineto argument."""
        out: list[tuple[str, object]] = []
        if self.sequence_number is not None:
            out.append(("Sequence number", self.sequence_number))
            if fwd_thread_id is not None:
                out.append(("Fwd thread id", fwd_thread_id))
        if self.input_dims is not None:
            out.append(("Input Dims", self.input_dims))
        return out


def parse(text: str) -> OpMarkup | None:
    """The op a range text names, or None when the text carries no ``emit_nvtx`` markup."""
    m = next((m for k in _KEY.finditer(text) if (m := _MARKUP.fullmatch(text, k.start())) is not None), None)
    if m is None:
        return None
    sizes, inputs = m.group("sizes"), m.group("inputs")
    return OpMarkup(
        # torch 1.2-1.12 drops the name of an op with shapes but no sequence number
        name=text[: m.start()] or text,
        sequence_number=int(m.group("seq")) if m.group("seq") is not None else None,
        stashed=m.group("stashed") is not None,
        op_id=int(m.group("op_id")) if m.group("op_id") is not None else None,
        input_dims=json.loads(sizes) if sizes is not None else None,
        input_op_ids=[[int(a), int(b)] for a, b in _PAIR.findall(inputs)] if inputs is not None else None,
    )


def is_backward(op: OpMarkup, parent_name: str | None) -> bool:
    """A backward node's range: marked ``stashed`` (torch <= 1.1), or directly inside the
    engine's ``autograd::engine::evaluate_function: NAME`` range of the same name."""
    return op.stashed or (op.sequence_number is not None and parent_name == EVALUATE_FUNCTION + op.name)


__all__ = ["EVALUATE_FUNCTION", "OpMarkup", "is_backward", "parse"]
