"""Length limits: a trace's strings (top-level metadata repeated in every request's resource,
span names, attribute values) are cut so requests stay under ``max_request_bytes`` and the
output stays proportional to the input, in both engines (OpenTelemetry's attribute value
length limit is the model)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest
from converter_helpers import all_spans_pb, decode, read_json_bytes, shared_trace, skip_unless_native

from otelprof.converter import ConvertResult, convert
from otelprof.converter._options import DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
from otelprof.resource import options_from_env

HUGE = 1_000_000
LIMIT = DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT


def _real() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(read_json_bytes(shared_trace("critical_path__alexnet")))
    return doc


def _huge_metadata(size: int = HUGE) -> bytes:
    """The real AlexNet trace with its top-level strings made ``size`` characters long."""
    doc = _real()
    doc["traceName"] = "t" * size  # becomes the run id: otelprof.run.id
    doc["host_name"] = "h" * size
    doc.setdefault("distributedInfo", {})["backend"] = "b" * size
    doc["deviceProperties"] = [{"id": i, "name": "g" * size} for i in range(2)]
    return json.dumps(doc).encode()


def _per_span_request(result: ConvertResult, max_bytes: int) -> None:
    """Every request is under the limit, or holds one span that alone is over it."""
    for request in result.requests:
        if len(request) > max_bytes:
            assert len(all_spans_pb([request])) == 1


def test_huge_top_level_strings_do_not_multiply_requests(engine: str) -> None:
    """Before: 1 MB strings gave one span per request, each repeating a 4 MB resource
    (523 requests, 2.1 GB from a 5 MB input)."""
    real = convert(json.dumps(_real()).encode(), engine=engine)
    crafted = _huge_metadata()
    result = convert(crafted, engine=engine)
    assert result.stats["spans"] == real.stats["spans"] > 500
    assert len(result.requests) == len(real.requests) == 1
    assert sum(map(len, result.requests)) < sum(map(len, real.requests)) + 4 * 4 * LIMIT
    assert sum(map(len, result.requests)) < len(crafted) / 10
    res = decode(result).resource
    assert res["host.name"] == "h" * LIMIT
    assert res["otelprof.distributed.backend"] == "b" * LIMIT
    assert res["otelprof.gpu.model"] == "g" * LIMIT
    assert res["otelprof.run.id"] == ("auto|" + "t" * HUGE)[:LIMIT]
    assert result.stats["values_truncated"] == 4


def test_the_resource_stays_a_small_part_of_small_requests(engine: str) -> None:
    max_bytes = 16 * 1024
    result = convert(_huge_metadata(), engine=engine, max_request_bytes=max_bytes)
    assert all(len(r) <= max_bytes for r in result.requests)
    res = decode(result).resource
    assert res["host.name"] == "h" * (max_bytes // 64)
    spans = result.stats["spans"]
    assert len(result.requests) < spans / 10  # ~1 span per request before
    baseline = convert(json.dumps(_real()).encode(), engine=engine, max_request_bytes=max_bytes)
    assert len(result.requests) <= 2 * len(baseline.requests)


def test_user_resource_attributes_are_kept_whole(engine: str) -> None:
    """The spec exempts resources from the limits: what the user configured is not cut."""
    long = "x" * (LIMIT + 10)
    result = convert(_huge_metadata(100), engine=engine, resource_attributes=(("team", long), ("host.name", long)))
    res = decode(result).resource
    assert res["team"] == long and res["host.name"] == long
    assert result.stats["values_truncated"] == 0


def _one_event(name: str, args: dict[str, Any]) -> bytes:
    doc = _real()
    doc["traceEvents"].append(
        {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 1e9, "dur": 100, "args": args}
    )
    return json.dumps(doc).encode()


@pytest.mark.parametrize("char", ["a", "é", "\U0001f600"], ids=["ascii", "2-byte", "4-byte"])
def test_names_and_attribute_values_are_cut_in_characters(engine: str, char: str) -> None:
    data = _one_event(
        char * 100_000,
        {"Call stack": char * 50_000, "Input Dims": [[1] * 40_000], "Module Hierarchy": char * 10},
    )
    result = convert(data, engine=engine, detail="full")
    [span] = _spans_named(result, char)
    attrs = {kv.key: kv.value.string_value for kv in span.attributes}
    # the name a tree shows: 128 characters, the last an ellipsis; the whole, cut to the
    # attribute limit, in otelprof.event.name
    assert span.name == char * 127 + "\N{HORIZONTAL ELLIPSIS}"
    assert attrs["otelprof.event.name"] == char * LIMIT
    assert attrs["code.stacktrace"] == char * LIMIT
    assert attrs["otelprof.op.input_dims"] == json.dumps([[1] * 40_000], separators=(",", ":"))[:LIMIT]
    assert attrs["otelprof.op.module_hierarchy"] == char * 10
    assert result.stats["values_truncated"] == 3  # stack, dims, the whole name (the short one loses nothing)
    unlimited = convert(data, engine=engine, detail="full", attribute_value_length_limit=None)
    [span] = _spans_named(unlimited, char)
    assert len(span.name) == 128  # names are always bounded
    unlimited_attrs = {kv.key: kv.value.string_value for kv in span.attributes}
    assert unlimited_attrs["code.stacktrace"] == char * 50_000
    assert unlimited_attrs["otelprof.event.name"] == char * 100_000


def _spans_named(result: ConvertResult, char: str) -> list[Any]:
    return [s for s in all_spans_pb(result.requests) if s.name.startswith(char * 100)]


def test_a_span_that_cannot_fit_goes_alone_and_bounded(engine: str) -> None:
    """With a 1 KiB request limit a span holding an 8192-character value cannot fit: it is
    sent alone, bounded by the limits, and the rest of the trace still splits normally."""
    data = _one_event("big", {"Call stack": "s" * 1_000_000, "Module Hierarchy": "m" * 1_000_000})
    result = convert(data, engine=engine, max_request_bytes=1024)
    _per_span_request(result, 1024)  # (real kernel names of 5k characters go alone too)
    [alone] = [r for r in result.requests if any(s.name == "big" for s in all_spans_pb([r]))]
    assert 1024 < len(alone) < 1024 + 2 * LIMIT + 512
    assert sum(map(len, result.requests)) < len(data) / 5  # the 2 MB of the two values are cut


@pytest.mark.slow  # a 60 MB trace converted in fresh processes
def test_huge_strings_keep_memory_bounded(tmp_path: Any) -> None:
    """Peak RSS (VmHWM: ru_maxrss would count the forked pytest) of converting a 60 MB crafted
    trace in a fresh process, both engines: before, 1 MB strings took 2 GB and such a trace
    10 GB; now the input, its parse and an output proportional to it."""
    path = tmp_path / "huge.json"
    path.write_bytes(_huge_metadata(12_000_000))
    code = (
        "import re, sys; from otelprof.converter import convert\n"
        "for engine in ('native', 'reference'):\n"
        "    r = convert(sys.argv[1], engine=engine)\n"
        "    assert len(r.requests) == 1, len(r.requests)\n"
        "status = open('/proc/self/status').read()\n"
        "print(int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1)) // 1024)\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True, text=True)
    assert int(run.stdout) < 768


def test_limit_from_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    assert options_from_env({}).attribute_value_length_limit == LIMIT
    assert options_from_env({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100"}).attribute_value_length_limit == 100
    both = {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "50"}
    assert options_from_env(both).attribute_value_length_limit == 50
    with caplog.at_level(logging.WARNING):
        bad = options_from_env({"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "-1"})
    assert bad.attribute_value_length_limit == LIMIT
    assert "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT" in caplog.text


def test_both_engines_cut_the_same_bytes() -> None:
    skip_unless_native()
    cases: list[tuple[bytes, dict[str, Any]]] = [
        (_huge_metadata(50_000), {"max_request_bytes": 16 * 1024}),
        (_one_event("é" * 9000, {"Call stack": "\U0001f600a" * 5000, "Input Dims": [["x" * 9000]]}), {}),
        (_one_event("n", {"Call stack": "s" * 100}), {"attribute_value_length_limit": 0}),
    ]
    for data, fields in cases:
        native, reference = (convert(data, engine=e, **fields) for e in ("native", "reference"))
        assert native.requests == reference.requests
        assert native.stats == reference.stats and native.stats["values_truncated"] > 0
