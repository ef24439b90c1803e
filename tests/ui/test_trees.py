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


def lane(span_id: str, parent: str, name: str = "gpu 0 · stream 7") -> trees.ReadSpan:
    attrs = {trees.CATEGORY: "otelprof", trees.SYNTHETIC: True, "otelprof.gpu.device": 0, "otelprof.gpu.stream": 7}
    return trees.ReadSpan(T, span_id, parent, name, attrs)


def aggregate(span_id: str, parent: str, name: str, count: int) -> trees.ReadSpan:
    attrs = {trees.CATEGORY: "cpu_op", trees.AGGREGATED_COUNT: count, "otelprof.aggregated_duration_ns": 9000}
    return trees.ReadSpan(T, span_id, parent, name, attrs)


def test_kernels_off_the_step_root_break_the_rule_and_only_exempt_launches_may_hang_there() -> None:
    direct = [STEP, kernel("04", "01")]
    via_launch = [STEP, span("03", "01", "cudaLaunchKernel", cat="cuda_runtime"), kernel("04", "03")]
    assert list(trees.kernels_under_ops(direct).problems) == ["kernels directly under the trace root"]
    assert list(trees.kernels_under_ops(via_launch).problems) == ["kernels under no CPU op or lane"]
    assert trees.kernels_under_ops(via_launch, exempt=frozenset({7})).ok
    # a lane takes what has no op above it: directly under the root is wrong even without a launch
    assert not trees.kernels_under_ops(direct, exempt=frozenset({7})).ok


def test_a_lane_is_a_legitimate_parent_of_kernels_a_synthetic_span_of_another_name_is_not() -> None:
    assert trees.kernels_under_ops([STEP, lane("05", "01"), kernel("04", "05")]).ok
    assert trees.kernels_under_ops([STEP, lane("05", "01", "gpu 0 · stream stream 7"), kernel("04", "05")]).ok
    fake = lane("05", "01", "gpu lane")  # synthetic but not named as a lane: neither lane nor op
    assert list(trees.kernels_under_ops([STEP, fake, kernel("04", "05")]).problems) == [
        "kernels under no CPU op or lane"
    ]


def test_device_spans_never_under_a_root_and_lanes_under_the_root_holding_device_work() -> None:
    good = [STEP, lane("05", "01"), kernel("04", "05"), LINEAR, span("06", "02", "Memcpy HtoD", cat="gpu_memcpy")]
    assert trees.device_work_and_lanes(good).ok
    assert trees.device_work_and_lanes(good).looked_at == 3
    memcpy = [STEP, span("06", "01", "Memcpy HtoD", cat="gpu_memcpy")]
    assert list(trees.device_work_and_lanes(memcpy).problems) == ["device spans directly under the trace root"]
    nested = [STEP, LINEAR, lane("05", "02"), kernel("04", "05")]
    assert list(trees.device_work_and_lanes(nested).problems) == ["lanes not directly under the trace root"]
    empty = [STEP, lane("05", "01")]
    assert list(trees.device_work_and_lanes(empty).problems) == ["lanes holding nothing, nothing folded into them"]
    folded = trees.ReadSpan(
        T, "05", "01", "gpu 0 · stream 7", {**empty[1].attributes, trees.FOLDED_DEVICE_COUNTS[1]: 3}
    )
    assert trees.device_work_and_lanes([STEP, folded]).ok  # the budget folded its memcpys into it
    holding_op = [STEP, lane("05", "01"), span("07", "05", "aten::mm")]
    assert list(trees.device_work_and_lanes(holding_op).problems) == ["lanes holding other spans than device work"]


def test_an_aggregate_is_named_for_its_count() -> None:
    assert trees.is_aggregate(aggregate("08", "02", "aten::view ×3", 3))
    assert not trees.is_aggregate(aggregate("08", "02", "aten::view ×3", 4))
    assert not trees.is_aggregate(aggregate("08", "02", "aten::view", 3))
    assert not trees.is_aggregate(span("08", "02", "aten::view ×3"))


def test_lanes_and_aggregates_arrive_intact_with_their_attributes_and_types() -> None:
    sent = [STEP, lane("05", "01"), kernel("04", "05"), LINEAR, aggregate("08", "02", "aten::view ×3", 3)]
    report = trees.rollups_arrive_intact(sent, sent)
    assert report.ok and report.looked_at == 2
    as_text = trees.ReadSpan(T, "05", "01", "gpu 0 · stream 7", {**sent[1].attributes, "otelprof.gpu.stream": "7"})
    renamed = trees.ReadSpan(T, "08", "02", "aten::view", sent[4].attributes)
    moved = trees.ReadSpan(T, "08", "01", "aten::view ×3", sent[4].attributes)
    assert list(trees.rollups_arrive_intact([STEP, as_text], sent).problems) == [
        "attributes changed or missing",
        "not read back",
    ]
    for wrong in (renamed, moved):
        read = [STEP, sent[1], wrong]
        assert list(trees.rollups_arrive_intact(read, sent).problems) == ["name or parent changed"]


def test_fwdbwd_links_between_ops_of_one_sequence_number() -> None:
    forward = span("05", "01", "aten::addmm", seq=3)
    backward = span("06", "01", "AddmmBackward0", links=fwdbwd("05"), seq=3)
    assert trees.fwdbwd_links_join_ops([STEP, forward, backward]).looked_at == 1
    assert trees.fwdbwd_links_join_ops([STEP, forward, backward]).ok
    moved = span("01", None, "ProfilerStep#1", links=fwdbwd("05"))  # a dropped op's link on the step
    other = span("06", "01", "AddmmBackward0", links=fwdbwd("05"), seq=4)
    missing = span("06", "01", "AddmmBackward0", links=fwdbwd("77"), seq=3)
    to_lane = span("06", "01", "AddmmBackward0", links=fwdbwd("05"), seq=3)
    at_an_end = ["links with a step span (trace root or ProfilerStep#N) or a lane at an end"]
    assert list(trees.fwdbwd_links_join_ops([moved, forward]).problems) == at_an_end
    assert list(trees.fwdbwd_links_join_ops([STEP, lane("05", "01"), to_lane]).problems) == at_an_end
    assert list(trees.fwdbwd_links_join_ops([STEP, forward, other]).problems) == [
        "links between different sequence numbers, neither end standing in for a folded op"
    ]
    assert list(trees.fwdbwd_links_join_ops([STEP, missing]).problems) == ["links whose forward end was not read back"]
    backward_forward = span("07", "01", "aten::linear", links=fwdbwd("05"), seq=3)
    assert list(trees.fwdbwd_links_join_ops([STEP, forward, backward_forward]).problems) == [
        "links not from a backward op to a forward op"
    ]


def test_fwdbwd_links_to_what_stands_for_an_op_that_is_no_span() -> None:
    """Default detail: a forward op folded into its parent or rolled into an aggregate is stood
    for by that span; an autograd engine call is a backward op whatever its node's name."""
    backward = span("06", "01", "autograd::engine::evaluate_function: torch::autograd::CppNode<F>", seq=3)
    backward = trees.ReadSpan(T, "06", "01", backward.name, backward.attributes, fwdbwd("05"))
    folded_into = trees.ReadSpan(T, "05", "01", "DistributedDataParallel.forward", {trees.HIDDEN_SPANS: 4})
    rolled_into = aggregate("05", "01", "aten::to ×2", 2)
    for stand_in in (folded_into, rolled_into):
        assert trees.fwdbwd_links_join_ops([STEP, stand_in, backward]).ok
    nothing_folded = trees.ReadSpan(T, "05", "01", "DistributedDataParallel.forward", {})
    assert list(trees.fwdbwd_links_join_ops([STEP, nothing_folded, backward]).problems) == [
        "links between different sequence numbers, neither end standing in for a folded op"
    ]


def test_spans_per_trace_within_the_budget() -> None:
    spans = [STEP, LINEAR, LAUNCH]
    assert trees.spans_within_budget(spans, 3).ok
    report = trees.spans_within_budget(spans, 2)
    assert report.problems["traces over the budget"] == [f"{T[:8]} (ProfilerStep#1): 3 spans"]
    assert "1 of 1 checked broke the rule" in str(report)
