"""tests/ui/trees.py's rules on small hand-made trees: each passes the shape it describes and
catches the shapes the UI tests must fail on (so a passing UI test is not a vacuous one)."""

from __future__ import annotations

from typing import Any

from . import trees

T = "aa" * 16


def span(
    span_id: str, parent: str | None, name: str, links: tuple[trees.ReadLink, ...] = (), **attributes: Any
) -> trees.ReadSpan:
    """``cat=`` the category (``cpu_op`` unless given), ``seq=`` the sequence number."""
    attrs: dict[str, Any] = {trees.CATEGORY: attributes.get("cat", "cpu_op")}
    if "seq" in attributes:
        attrs[trees.SEQUENCE] = attributes["seq"]
    return trees.ReadSpan(T, span_id, parent, name, attrs, links)


def kernel(span_id: str, parent: str, correlation: int = 7) -> trees.ReadSpan:
    return trees.ReadSpan(T, span_id, parent, "gemm", {trees.CATEGORY: "kernel", trees.CORRELATION: correlation})


def fwdbwd(target: str) -> tuple[trees.ReadLink, ...]:
    return (trees.ReadLink(T, target, {trees.LINK_KIND: "fwdbwd"}),)


STEP = span("01", None, "ProfilerStep#1")
LINEAR = span("02", "01", "aten::linear")
LAUNCH = span("03", "02", "cudaLaunchKernel", cat="cuda_runtime")


def test_one_root_and_no_orphans() -> None:
    assert trees.one_root_per_trace([STEP, LINEAR]).ok
    report = trees.one_root_per_trace([STEP, LINEAR, span("09", None, "other"), span("0a", "ff", "orphan")])
    assert set(report.problems) == {
        "traces without exactly one root",
        "traces with spans whose parent was not read back",
    }


def test_kernels_under_an_op_directly_or_through_the_launch() -> None:
    assert trees.kernels_under_ops([STEP, LINEAR, LAUNCH, kernel("04", "03")]).ok
    assert trees.kernels_under_ops([STEP, LINEAR, kernel("04", "02")]).ok


def test_kernels_off_the_step_root_break_the_rule_unless_exempt() -> None:
    direct = [STEP, kernel("04", "01")]
    via_launch = [STEP, span("03", "01", "cudaLaunchKernel", cat="cuda_runtime"), kernel("04", "03")]
    assert list(trees.kernels_under_ops(direct).problems) == ["kernels directly under the trace root"]
    assert list(trees.kernels_under_ops(via_launch).problems) == ["kernels under a launch under the root"]
    assert trees.kernels_under_ops(direct, exempt=frozenset({7})).ok


def test_fwdbwd_links_between_ops_of_one_sequence_number() -> None:
    forward = span("05", "01", "aten::addmm", seq=3)
    backward = span("06", "01", "AddmmBackward0", links=fwdbwd("05"), seq=3)
    assert trees.fwdbwd_links_join_ops([STEP, forward, backward]).looked_at == 1
    assert trees.fwdbwd_links_join_ops([STEP, forward, backward]).ok
    moved = span("01", None, "ProfilerStep#1", links=fwdbwd("05"))  # a dropped op's link on the step
    other = span("06", "01", "AddmmBackward0", links=fwdbwd("05"), seq=4)
    missing = span("06", "01", "AddmmBackward0", links=fwdbwd("77"), seq=3)
    assert list(trees.fwdbwd_links_join_ops([moved, forward]).problems) == [
        "links with a step span (trace root or ProfilerStep#N) at an end"
    ]
    assert list(trees.fwdbwd_links_join_ops([STEP, forward, other]).problems) == [
        "links between different sequence numbers"
    ]
    assert list(trees.fwdbwd_links_join_ops([STEP, missing]).problems) == ["links whose forward end was not read back"]


def test_spans_per_trace_within_the_budget() -> None:
    spans = [STEP, LINEAR, LAUNCH]
    assert trees.spans_within_budget(spans, 3).ok
    report = trees.spans_within_budget(spans, 2)
    assert report.problems["traces over the budget"] == [f"{T[:8]} (ProfilerStep#1): 3 spans"]
    assert "1 of 1 checked broke the rule" in str(report)
