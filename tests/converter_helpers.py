"""Helpers for the converter tests: shared traces, cached conversions, decoded spans.

Everything here decodes what the converter produced with the official
opentelemetry-proto classes, so the tests check values, not just that a call returned.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from otelprof.converter import ConvertOptions, ConvertResult, convert, native_available
from otelprof.otlp import ids

#: ``../shared/traces`` beside the repository root.
SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
KINETO = SHARED / "kineto"

#: Every shared Kineto trace (sorted, so test ids are stable).
KINETO_TRACES: list[Path] = sorted(KINETO.glob("*.json.gz")) if KINETO.is_dir() else []

#: Substring naming the 216k-event trace the reference engine runs only once (full detail).
BIG_TRACE = "df_index_resolver"
#: Big traces whose default-detail conversion the slow reference engine skips (the native
#: engine converts them at both levels; the reference still converts them at full detail).
#: What they would add at default detail is covered by the other big traces: nccl_data
#: (fwdbwd flows), trace_diff (split mode, async_cpu_to_gpu flows), resnet50_num_workers
#: (legacy categories, memory events over the event limit) and mi300 (python_function).
REFERENCE_SKIPS_DEFAULT = (BIG_TRACE, "resnet50_autograd_api", "ns_resolution_trace")
#: Traces with at least this many events count as "big" for the slow reference engine.
BIG_EVENTS = 10_000
# For a test that takes seconds on the reference engine: both engines, the reference marked slow
# (``pytest -m "not slow"`` keeps the native one). Indirect, so the ``engine`` fixture still runs.
SLOW_REFERENCE = pytest.mark.parametrize(
    "engine", [pytest.param("reference", marks=pytest.mark.slow), "native"], indirect=True
)

RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "Runtime", "cuda_driver"})
#: Device work launched by a runtime call (all three category generations) and syncs.
LAUNCHED_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "cuda_sync"})
DEVICE_CATEGORIES = LAUNCHED_CATEGORIES | {"gpu_user_annotation", "mtia_ccp_events"}


#: The two converter engines (the ``engine`` fixture of tests/converter/conftest.py).
ENGINES = ["reference", "native"]


def reference_skips_default(path: Path) -> bool:
    return any(fragment in path.name for fragment in REFERENCE_SKIPS_DEFAULT)


def shared_trace(fragment: str) -> Path:
    """The one shared Kineto trace whose file name contains ``fragment``."""
    matches = [p for p in KINETO_TRACES if fragment in p.name]
    if len(matches) != 1:
        pytest.skip(f"shared trace {fragment!r} not found under {KINETO} ({len(matches)} matches)")
    return matches[0]


def trace_id_for(path: Path) -> str:
    """A short, stable test id for a trace file."""
    name = path.name.removesuffix(".json.gz")
    for prefix in (
        "hta__tests__data__",
        "kineto__tb_plugin__samples__",
        "param__et_replay__tests__inputs__",
        "tracelens__tests__traces__",
    ):
        name = name.removeprefix(prefix)
    return name[:48]


def native_required() -> bool:
    from otelprof.settings import value
    from otelprof.settings.variables import OTELPROF_REQUIRE_NATIVE

    return bool(value(os.environ, OTELPROF_REQUIRE_NATIVE))


def native_module() -> Any:
    """``otelprof._native``; a test without it is skipped, or fails where
    ``OTELPROF_REQUIRE_NATIVE`` is set (CI): ``pytest.importorskip`` would skip even there."""
    try:
        import otelprof._native as native
    except ImportError as error:
        if native_required():
            raise AssertionError(
                f"OTELPROF_REQUIRE_NATIVE is set but otelprof._native does not load: {error}"
            ) from error
        pytest.skip(
            "otelprof._native is not built (set OTELPROF_REQUIRE_NATIVE=true to fail instead)", allow_module_level=True
        )
    return native


def skip_unless_native() -> None:
    """Skip when ``otelprof._native`` is missing, unless CI demands it (then the test fails)."""
    if not native_available() and not native_required():
        pytest.skip("otelprof._native is not built (set OTELPROF_REQUIRE_NATIVE=true to fail instead)")


# --- conversions (memoised per process: the same trace is converted once per engine/options) ---

_CACHE: dict[tuple[Any, ...], ConvertResult] = {}


def convert_cached(path: Path, engine: str, **fields: Any) -> ConvertResult:
    """``convert(path, engine=engine, **fields)``, memoised for the test session.

    Results are immutable in practice (tests never mutate them), so sharing is safe.
    """
    key = (str(path), engine, tuple(sorted(fields.items())))
    result = _CACHE.get(key)
    if result is None:
        result = convert(path, engine=engine, options=ConvertOptions(**fields))
        _CACHE[key] = result
    return result


def event_count(path: Path) -> int:
    return len(load_raw(path).events)


def is_big(path: Path) -> bool:
    return event_count(path) >= BIG_EVENTS


# --- raw JSON -----------------------------------------------------------------------------


@dataclass
class RawTrace:
    """The trace as plain JSON (floats as exact ``Decimal``), for computing expectations."""

    doc: dict[str, Any]
    events: list[Any]

    @property
    def base_ns(self) -> int:
        base = self.doc.get("baseTimeNanoseconds")
        return base if isinstance(base, int) else 0

    def complete(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(ordinal, event) of every ``ph == "X"`` event."""
        for i, e in enumerate(self.events):
            if isinstance(e, dict) and e.get("ph") == "X":
                yield i, e


def micros_to_ns(value: Any) -> int:
    """Exact ``round_half_up(value * 1000)`` of a JSON number of microseconds."""
    return int((Decimal(value) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def read_json_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


@cache  # ~600 MB for all shared traces; each is parsed once per session
def load_raw(path: Path) -> RawTrace:
    doc = json.loads(read_json_bytes(path), parse_float=Decimal)
    if isinstance(doc, list):
        return RawTrace({"traceEvents": doc}, doc)
    return RawTrace(doc, doc["traceEvents"])


# --- decoding -----------------------------------------------------------------------------


def any_value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which)


def attr_dict(attrs: Any) -> dict[str, Any]:
    """KeyValue list -> dict (asserting keys are unique, as OTLP requires)."""
    out: dict[str, Any] = {}
    for kv in attrs:
        assert isinstance(kv, KeyValue)
        assert kv.key not in out, f"duplicate attribute key {kv.key!r}"
        out[kv.key] = any_value(kv.value)
    return out


@dataclass(slots=True)
class DLink:
    trace_id: bytes
    span_id: bytes
    attrs: dict[str, Any]


@dataclass(slots=True)
class DEvent:
    time: int
    name: str
    attrs: dict[str, Any]


@dataclass(slots=True)
class DSpan:
    trace_id: bytes
    span_id: bytes
    parent_id: bytes
    name: str
    start: int
    end: int
    kind: int
    attrs: dict[str, Any]
    links: list[DLink]
    events: list[DEvent]
    dropped_events: int
    dropped_links: int
    request: int

    @property
    def category(self) -> str:
        return str(self.attrs.get("otelprof.event.category", ""))

    @property
    def synthetic(self) -> bool:
        return "otelprof.synthetic" in self.attrs

    @property
    def event_name(self) -> str:
        """The event's own name: a kernel's is in ``otelprof.gpu.kernel_name`` when it was folded,
        any other's in ``otelprof.event.name`` when it was cut."""
        return str(self.attrs.get("otelprof.gpu.kernel_name", self.attrs.get("otelprof.event.name", self.name)))

    @property
    def device(self) -> bool:
        return self.category in DEVICE_CATEGORIES


def decode_requests(requests: list[bytes]) -> list[ExportTraceServiceRequest]:
    out = []
    for raw in requests:
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(raw)
        out.append(msg)
    return out


@dataclass
class Decoded:
    """All spans of a ConvertResult, in request order, with indexes."""

    result: ConvertResult
    messages: list[ExportTraceServiceRequest]
    spans: list[DSpan]
    resource: dict[str, Any]
    scope_name: str
    scope_version: str
    by_id: dict[bytes, DSpan] = field(default_factory=dict)
    by_trace: dict[bytes, list[DSpan]] = field(default_factory=dict)

    def span_id_of_event(self, ordinal: int) -> bytes:
        """The span id the span model gives the trace event at ``ordinal`` (see reference/ids.py)."""
        rank = self.resource.get("otelprof.distributed.rank")
        run_id, rank_s = str(self.resource["otelprof.run.id"]), "" if rank is None else str(rank)
        base = ids.span_base(run_id, rank_s, self.result.window_id)
        return ids.span_id(base, ordinal)

    def span_of_event(self, ordinal: int) -> DSpan | None:
        return self.by_id.get(self.span_id_of_event(ordinal))

    def roots(self) -> list[DSpan]:
        return [s for s in self.spans if not s.parent_id]


def decode(result: ConvertResult) -> Decoded:
    messages = decode_requests(result.requests)
    spans: list[DSpan] = []
    resource: dict[str, Any] | None = None
    scope: tuple[str, str] | None = None
    for k, msg in enumerate(messages):
        assert len(msg.resource_spans) == 1, "one ResourceSpans per request"
        rs = msg.resource_spans[0]
        res = attr_dict(rs.resource.attributes)
        if resource is None:
            resource = res
        assert res == resource, "every request carries the same resource"
        assert len(rs.scope_spans) == 1, "one ScopeSpans per request"
        ss = rs.scope_spans[0]
        this_scope = (ss.scope.name, ss.scope.version)
        if scope is None:
            scope = this_scope
        assert this_scope == scope, "every request carries the same scope"
        for pb in ss.spans:
            spans.append(
                DSpan(
                    pb.trace_id,
                    pb.span_id,
                    pb.parent_span_id,
                    pb.name,
                    pb.start_time_unix_nano,
                    pb.end_time_unix_nano,
                    pb.kind,
                    attr_dict(pb.attributes),
                    [DLink(lk.trace_id, lk.span_id, attr_dict(lk.attributes)) for lk in pb.links],
                    [DEvent(ev.time_unix_nano, ev.name, attr_dict(ev.attributes)) for ev in pb.events],
                    pb.dropped_events_count,
                    pb.dropped_links_count,
                    k,
                )
            )
    decoded = Decoded(result, messages, spans, resource or {}, (scope or ("", ""))[0], (scope or ("", ""))[1])
    for s in spans:
        assert s.span_id not in decoded.by_id, f"duplicate span id {s.span_id.hex()} ({s.name})"
        decoded.by_id[s.span_id] = s
        decoded.by_trace.setdefault(s.trace_id, []).append(s)
    return decoded


def all_spans_pb(requests: list[bytes]) -> list[Any]:
    """Every protobuf Span of the requests, in order."""
    return [s for m in decode_requests(requests) for rs in m.resource_spans for ss in rs.scope_spans for s in ss.spans]


def fwdbwd_pairs(raw: RawTrace) -> dict[Any, tuple[dict[str, Any], dict[str, Any]]]:
    """Complete ``fwdbwd`` flow pairs: id -> (first ``s`` event, first ``f`` event)."""
    starts: dict[Any, dict[str, Any]] = {}
    ends: dict[Any, dict[str, Any]] = {}
    for e in raw.events:
        if isinstance(e, dict) and e.get("cat") == "fwdbwd":
            key = e.get("id")
            if e.get("ph") == "s":
                starts.setdefault(key, e)
            elif e.get("ph") == "f":
                ends.setdefault(key, e)
    return {k: (starts[k], ends[k]) for k in ends if k in starts}


def cpu_op_event(k: int, **over: Any) -> dict[str, Any]:
    """The k-th of a run of small CPU ops on three threads, as Kineto writes them; `over` replaces fields."""
    ev: dict[str, Any] = {
        "ph": "X",
        "cat": "cpu_op",
        "name": f"aten::op{k % 7}",
        "pid": 1,
        "tid": 2 + k % 3,
        "ts": 1000 + 10 * k,
        "dur": 5,
        "args": {"External id": k, "Sequence number": k // 2, "Fwd thread id": 1},
    }
    ev.update(over)
    return ev
