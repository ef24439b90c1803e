"""emit_nvtx range texts, as torch's getNvtxStr writes them in each generation."""

from __future__ import annotations

import pytest

from otelprof.importer.nvtx_markup import EVALUATE_FUNCTION, is_backward, parse


@pytest.mark.parametrize(
    ("text", "name", "seq", "stashed", "op_id", "dims", "inputs"),
    [
        # torch 2.x: NAME, seq = N, op_id = K, sizes = [...], input_op_ids = [...]
        (
            "aten::addmm, seq = 8, op_id = 103, sizes = [[3], [2, 4], [4, 3], [], []], "
            "input_op_ids = [(0,-1), (0,-1), (102,0), (0,-1), (0,-1)]",
            "aten::addmm", 8, False, 103, [[3], [2, 4], [4, 3], [], []],
            [[0, -1], [0, -1], [102, 0], [0, -1], [0, -1]],
        ),
        ("aten::empty, op_id = 5", "aten::empty", None, False, 5, None, None),  # seq -1: name and op id
        ("AddmmBackward0, seq = 8, op_id = 202", "AddmmBackward0", 8, False, 202, None, None),
        (f"{EVALUATE_FUNCTION}TBackward0, op_id = 201", f"{EVALUATE_FUNCTION}TBackward0", None, False, 201, None, None),
        # torch 1.2-1.12: NAME, seq = N, sizes = [...]; no name when there is no sequence number
        ("aten::mul, seq = 4, sizes = [[2], []]", "aten::mul", 4, False, None, [[2], []], None),
        (", sizes = [[4, 4], []]", ", sizes = [[4, 4], []]", None, False, None, [[4, 4], []], None),
        # torch 0.4-1.1: NAME, seq=N / NAME, stashed seq=M
        ("relu, seq=3", "relu", 3, False, None, None, None),
        ("ThresholdBackward, stashed seq=3", "ThresholdBackward", 3, True, None, None, None),
        # a name with commas keeps them
        ("my, block, seq = 2", "my, block", 2, False, None, None, None),
    ],
)  # fmt: skip
def test_markup_is_read_into_name_and_fields(
    text: str, name: str, seq: int | None, stashed: bool, op_id: int | None, dims: object, inputs: object
) -> None:
    op = parse(text)
    assert op is not None
    assert (op.name, op.sequence_number, op.stashed, op.op_id, op.input_dims, op.input_op_ids) == (
        name, seq, stashed, op_id, dims, inputs,
    )  # fmt: skip


@pytest.mark.parametrize(
    "text",
    ["saxpy", "MPI_Send", "step 1, warm-up", "x, seq = ", "x, sizes = [[1, 2]", "x, seq = 3 trailing", ""],
)
def test_text_without_markup_is_left_alone(text: str) -> None:
    assert parse(text) is None


def test_backward_is_the_node_inside_its_engine_range_or_a_stashed_one() -> None:
    node = parse("AddmmBackward0, seq = 8, op_id = 202")
    assert node is not None
    assert is_backward(node, f"{EVALUATE_FUNCTION}AddmmBackward0")
    assert not is_backward(node, f"{EVALUATE_FUNCTION}TBackward0")  # another node's range
    assert not is_backward(node, None)
    inner = parse("aten::mm, seq = 9, op_id = 203")  # an op the node runs
    assert inner is not None and not is_backward(inner, "AddmmBackward0")
    old = parse("ThresholdBackward, stashed seq=3")
    assert old is not None and is_backward(old, None)


def test_kineto_args_are_what_torch_writes_on_a_cpu_op() -> None:
    op = parse("aten::addmm, seq = 8, op_id = 103, sizes = [[3], []], input_op_ids = [(102,0), (0,-1)]")
    assert op is not None
    assert op.kineto_args() == [("Sequence number", 8), ("Input Dims", [[3], []])]
    assert op.kineto_args(4243) == [("Sequence number", 8), ("Fwd thread id", 4243), ("Input Dims", [[3], []])]
    no_seq = parse("aten::empty, op_id = 5")
    assert no_seq is not None and no_seq.kineto_args(7) == []  # no sequence number: nothing to link
