"""``ConvertOptions.resource_attributes`` with typed values (a live session passes its whole
resource so its windows' spans share the step spans'): kept first, whole and typed, then what the
trace adds that they lack; both engines alike."""

from __future__ import annotations

from typing import Any

import pytest
from converter_helpers import shared_trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof import ConvertOptions, convert
from otelprof.otlp.spans import Attrs

SESSION: Attrs = [
    ("service.name", "trainer"),
    ("telemetry.sdk.name", "otelprof"),
    ("telemetry.sdk.language", "python"),
    ("telemetry.sdk.version", "9.9"),
    ("process.pid", 4242),
    ("otelprof.distributed.rank", 1),
    ("otelprof.distributed.world_size", 8),
    ("x.ratio", 0.5),
    ("x.ok", True),
]


KINDS = {bool: "bool_value", int: "int_value", float: "double_value", str: "string_value"}


def _typed(value: Any) -> tuple[str, Any]:
    kind = value.WhichOneof("value")
    return kind, getattr(value, kind)


def test_the_session_resource_first_typed_then_the_traces_own(engine: str) -> None:
    trace = shared_trace("bert-small")  # an H100 trace: it names its GPU
    options = ConvertOptions(run_id="r", rank=1, world_size=8, resource_attributes=tuple(SESSION), scope_version="1")
    result = convert(trace, options=options, engine=engine)
    resources = {
        tuple((kv.key, _typed(kv.value)) for kv in rs.resource.attributes)
        for raw in result.requests
        for rs in ExportTraceServiceRequest.FromString(raw).resource_spans
    }
    [resource] = resources  # every request of the trace carries the same one
    keys = [key for key, _ in resource]
    assert resource[: len(SESSION)] == tuple(
        (
            k,
            ("bool_value", v)
            if isinstance(v, bool)
            else ("int_value", v)
            if isinstance(v, int)
            else ("double_value", v)
            if isinstance(v, float)
            else ("string_value", v),
        )
        for k, v in SESSION
    )
    extra = keys[len(SESSION) :]
    assert "otelprof.gpu.model" in extra and "otelprof.gpu.count" in extra  # the trace's, the session lacks them
    assert len(keys) == len(set(keys))  # the session's keys are not repeated from the trace


@pytest.mark.parametrize("value", [object(), None, 2**63, [1]])
def test_a_value_otlp_cannot_carry_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="resource_attributes must be"):
        ConvertOptions(resource_attributes=(("k", value),))  # type: ignore[arg-type]
