"""Conversion options shared by the native core and the Python reference."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..otlp._text import clean
from ..otlp.resource import ResourceFacts, compose_resource
from ..otlp.spans import Attrs, AttrValue

Detail = Literal["full", "default"]
#: How live steps find their ``ProfilerStep#N`` markers (``ConvertOptions.live_match``).
LiveMatch = Literal["number", "time"]

#: Collector's default gRPC receive limit is 4 MiB; stay well under it.
DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024
#: In ``default`` detail, CPU-side spans shorter than this are dropped or aggregated.
DEFAULT_MIN_DURATION_NS = 10_000
#: OpenTelemetry's default span event / link count limits (OTEL_SPAN_EVENT_COUNT_LIMIT).
DEFAULT_EVENT_LIMIT = 128
DEFAULT_LINK_LIMIT = 128
#: At default detail, the most spans one trace holds (a step's, a detail or a window trace):
#: Phoenix shows at most 1,000 spans of a trace, Jaeger's UI slows past ~2,000 and MLflow took a
#: minute to draw 3,000. Repeated siblings are aggregated first, then the least significant dropped.
DEFAULT_SPAN_BUDGET = 1000
#: From this world size on, operator/kernel detail moves to per-rank traces.
DEFAULT_SPLIT_WORLD_SIZE = 4
#: Characters kept of a string attribute value (OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT): the SDK's
#: default is no limit, but a trace's strings are input: the longest real values are ~3.3k.
DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT = 8192
#: Characters kept of a span name (the longest real kernel names are ~5.1k).
SPAN_NAME_LENGTH_LIMIT = 8192
#: A resource value the trace supplies keeps at most max_request_bytes / this many characters,
#: so the resource, repeated in every request, stays a small part of one.
RESOURCE_VALUE_SHARE = 64

_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class LiveStep:
    """A live ``train.step`` span that a profiled step's operators go under (capture/windows.py):
    ``ProfilerStep#number`` becomes its child, in its trace, and each CPU span directly under
    ``ProfilerStep#number`` moves under the phase span it overlaps most in time (the first such;
    an ``Optimizer.step`` annotation begins just before the phase its hooks time), else stays
    under ``ProfilerStep#number``. With ``ConvertOptions.live_match="time"`` the marker is found
    by time instead, whatever its number: the one ``[start_ns, end_ns]`` overlaps most."""

    number: int
    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes
    phases: tuple[tuple[bytes, int, int], ...] = ()  # (span id, start ns, end ns)
    trigger: str = ""  # what started the window (early, schedule, on_demand, anomaly): otelprof.window.trigger
    start_ns: int = 0  # the live step's own interval, in the phases' time base (live_match="time")
    end_ns: int = 0
    #: the phases' names (data, forward, backward, optimizer), in ``phases`` order; () unknown
    phase_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ok = isinstance(self.number, int) and 0 <= self.number <= _INT64_MAX
        ok = ok and all(isinstance(n, str) for n in self.phase_names)
        ok = ok and len(self.phase_names) in (0, len(self.phases))
        for t in (self.start_ns, self.end_ns):
            ok = ok and isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= _INT64_MAX
        ok = ok and self.start_ns <= self.end_ns
        ok = ok and isinstance(self.trace_id, bytes) and len(self.trace_id) == 16
        ok = ok and isinstance(self.span_id, bytes) and len(self.span_id) == 8
        ok = ok and isinstance(self.trigger, str)
        for phase in self.phases:
            ok = ok and len(phase) == 3 and isinstance(phase[0], bytes) and len(phase[0]) == 8
            ok = ok and all(isinstance(t, int) and 0 <= t <= _INT64_MAX for t in phase[1:])
        if not ok:
            raise ValueError(f"malformed live step: {self!r}")


def _attr_value(value: object) -> bool:
    """A value OTLP carries as it is: a string, a bool, a float or a signed 64-bit integer."""
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**63
    return isinstance(value, str | bool | float)


#: Bytes of an op attribute's key (the native encoder's key table holds keys of up to 62).
OP_ATTRIBUTE_KEY_BYTES = 60


def _check_op_attributes(given: object) -> None:
    if not isinstance(given, Mapping):
        raise ValueError(f"op_attributes must be a mapping of record function id to attributes, not {given!r}")
    for rf_id, attrs in given.items():
        if not (isinstance(rf_id, int) and not isinstance(rf_id, bool) and -(2**63) <= rf_id <= _INT64_MAX):
            raise ValueError(f"op_attributes: a record function id is a 64-bit integer, not {rf_id!r}")
        if isinstance(attrs, str | bytes) or not isinstance(attrs, Sequence):
            raise ValueError(f"op_attributes[{rf_id}] must be a sequence of (key, value) pairs, not {attrs!r}")
        for item in attrs:
            ok = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and _attr_value(item[1])
            if not ok or not 0 < len(item[0].encode("utf-8", "replace")) <= OP_ATTRIBUTE_KEY_BYTES:
                raise ValueError(
                    f"op_attributes[{rf_id}]: {item!r} is not a (key of 1-{OP_ATTRIBUTE_KEY_BYTES} bytes, "
                    "str/int/float/bool) pair"
                )


@dataclass(frozen=True)
class ConvertOptions:
    """How a Kineto trace becomes OTLP spans. Every field has a safe default.

    ``run_id`` decides trace ids: the same run id and step give the same trace id on
    every rank. When ``None`` it is derived from the trace (its ``trace_id`` metadata,
    else its name and start time), which is unique per file.
    """

    run_id: str | None = None
    rank: int | None = None
    world_size: int | None = None
    detail: Detail = "default"
    min_duration_ns: int = DEFAULT_MIN_DURATION_NS
    event_limit: int = DEFAULT_EVENT_LIMIT
    link_limit: int = DEFAULT_LINK_LIMIT
    span_budget: int = DEFAULT_SPAN_BUDGET
    split_world_size: int = DEFAULT_SPLIT_WORLD_SIZE
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    attribute_value_length_limit: int | None = DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
    #: Resource attributes put first and kept whole: strings from ``OTEL_RESOURCE_ATTRIBUTES``, or
    #: typed values (a live session passes its own resource, so a window's spans share it).
    resource_attributes: tuple[tuple[str, AttrValue], ...] = field(default_factory=tuple)
    host_name: str | None = None
    base_time_ns: int | None = None
    group_by_input_shapes: bool = False
    scope_version: str = ""
    #: Live step spans the profiled steps go under (not with split detail traces); () for files.
    live_steps: tuple[LiveStep, ...] = ()
    #: How a live step finds its ``ProfilerStep#N``: ``"number"``, the one whose N is its number;
    #: ``"time"``, markers in order of start each take the unused live step whose
    #: ``[start_ns, end_ns]`` overlaps them most (a user's own profiler numbers its steps itself).
    live_match: LiveMatch = "number"
    #: Threads one conversion may use: with 2, a second thread parses the second half of a large
    #: trace (8 MiB of JSON or more, from bytes or a plain ``.json`` file) while the first parses
    #: the rest, and from 16k events or spans the build and the encoder share their work with it;
    #: the output is the same. A profiling window converts with 1, beside training.
    threads: int = 2
    #: Where the trace this conversion reads is kept (a live window's raw Kineto file, an imported
    #: file): named on every trace root as ``otelprof.source.file``; None: not named.
    source_file: str | None = None
    #: The execution trace joined into ``op_attributes`` (kept beside a live window's trace, or
    #: imported): named on every trace root as ``otelprof.execution_trace.file``; None: not named.
    execution_trace_file: str | None = None
    #: Extra attributes of op spans by Kineto's ``Record function id`` (an execution trace's
    #: tensor shapes and ids: ``converter/execution_trace.py``), appended in order to the span of
    #: each event with that id. An event that is no span of its own (aggregated, or folded into
    #: the span above it) counts in ``op_attributes_unplaced``; an id no event has in
    #: ``op_attributes_unmatched``; each span given them in ``op_attributes_joined``; an event
    #: with an id that has none (when any are given) in ``op_attributes_missing``.
    op_attributes: Mapping[int, Sequence[tuple[str, AttrValue]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.detail not in ("full", "default"):
            raise ValueError(f"detail must be 'full' or 'default', not {self.detail!r}")
        for name in ("min_duration_ns", "event_limit", "link_limit", "span_budget", "split_world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _INT64_MAX:
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
        if not isinstance(self.max_request_bytes, int) or self.max_request_bytes < 1024:
            raise ValueError(f"max_request_bytes must be an integer >= 1024, not {self.max_request_bytes!r}")
        for name in ("rank", "world_size", "base_time_ns", "attribute_value_length_limit"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _INT64_MAX
            ):
                raise ValueError(f"{name} must be a non-negative integer or None, not {value!r}")
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise ValueError(f"threads must be an integer >= 1, not {self.threads!r}")
        if self.run_id is not None and not isinstance(self.run_id, str):
            raise ValueError(f"run_id must be a string or None, not {self.run_id!r}")
        for name in ("source_file", "execution_trace_file"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string or None, not {getattr(self, name)!r}")
        if not all(isinstance(s, LiveStep) for s in self.live_steps):
            raise ValueError("live_steps must be LiveStep values")
        if self.live_match not in ("number", "time"):
            raise ValueError(f"live_match must be 'number' or 'time', not {self.live_match!r}")
        _check_op_attributes(self.op_attributes)
        for item in self.resource_attributes:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and _attr_value(item[1])):
                raise ValueError(f"resource_attributes must be (key, str/int/float/bool) pairs, not {item!r}")

    @property
    def full(self) -> bool:
        return self.detail == "full"

    @property
    def span_event_limit(self) -> int:
        """Events kept per span; 0 = unlimited (always so at ``full`` detail)."""
        return 0 if self.full else self.event_limit

    @property
    def span_link_limit(self) -> int:
        return 0 if self.full else self.link_limit

    @property
    def trace_span_budget(self) -> int:
        """Spans kept per trace; 0 = unlimited (always so at ``full`` detail)."""
        return 0 if self.full else self.span_budget

    @property
    def resource_value_limit(self) -> int:
        """Characters kept of a resource value taken from the trace (host, backend, GPU model)
        or computed (run id): the attribute limit, and a share of a request."""
        share = self.max_request_bytes // RESOURCE_VALUE_SHARE
        limit = self.attribute_value_length_limit
        return share if limit is None else min(limit, share)

    def resource(self, facts: ResourceFacts) -> tuple[Attrs, int]:
        """A converted trace's resource and how many computed values were cut (both engines:
        the native core calls this through ``as_native()["resource"]``); ``host_name`` names
        the host when the trace does not."""
        if not facts.host_name and self.host_name:
            facts = dataclasses.replace(facts, host_name=self.host_name)
        return compose_resource(self.resource_attributes, self.scope_version, facts, self.resource_value_limit)

    def _native_resource(
        self,
        host_name: str | None,
        rank: int | None,
        world_size: int | None,
        backend: str,
        gpu_models: list[str],
        run_id: str,
    ) -> tuple[Attrs, int]:
        facts = ResourceFacts(
            host_name=host_name, rank=rank, world_size=world_size, backend=backend, gpu_models=gpu_models, run_id=run_id
        )
        return self.resource(facts)

    def as_native(self) -> dict[str, object]:
        """The flat dict the native core takes (same keys as the fields)."""
        return {
            "run_id": None if self.run_id is None else clean(self.run_id),
            "rank": -1 if self.rank is None else self.rank,
            "world_size": -1 if self.world_size is None else self.world_size,
            "full": self.full,
            "min_duration_ns": self.min_duration_ns,
            "event_limit": self.span_event_limit,
            "link_limit": self.span_link_limit,
            "span_budget": self.trace_span_budget,
            "split_world_size": self.split_world_size,
            "max_request_bytes": self.max_request_bytes,
            "attribute_value_length_limit": -1
            if self.attribute_value_length_limit is None
            else self.attribute_value_length_limit,
            "resource": self._native_resource,
            "base_time_ns": -1 if self.base_time_ns is None else self.base_time_ns,
            "group_by_input_shapes": self.group_by_input_shapes,
            "scope_version": clean(self.scope_version),
            "live_steps": [
                (s.number, s.trace_id, s.span_id, list(s.phases), s.trigger, s.start_ns, s.end_ns)
                for s in self.live_steps
            ],
            "live_match": self.live_match,
            "threads": self.threads,
            "source_file": None if self.source_file is None else clean(self.source_file),
            "execution_trace_file": None if self.execution_trace_file is None else clean(self.execution_trace_file),
            "op_attributes": {
                rf_id: [(clean(k), clean(v) if isinstance(v, str) else v) for k, v in attrs]
                for rf_id, attrs in self.op_attributes.items()
            },
        }
