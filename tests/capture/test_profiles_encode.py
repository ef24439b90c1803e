"""The profile encoders (capture/profiles/encode.py, stacks.collapsed) write what the row-by-row
encoders they replaced wrote, byte for byte: those are kept below as the reference (``ref_*``,
as they were before issue 37's encoding pass was made cheap), and both are run on the shared
traces with Python stacks, a live window's, and generated samples (steps, missing links,
zero and negative values, equal labels on distinct frames, names with ``;`` and line breaks).
benchmarks/profiles.py times both."""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otelprof.capture.profiles import encode, stacks
from otelprof.capture.profiles.stacks import Frame, Samples
from otelprof.converter import LiveStep
from otelprof.otlp.encoder import attributes
from otelprof.otlp.spans import Attrs

UNIT = "nanoseconds"
CPU, DEVICE = "cpu", "device"

Key = tuple[tuple[Frame, ...], int | None]

# --- the reference: the encoders as they were ---------------------------------------------------


class _RefDictionary:
    def __init__(self) -> None:
        self.msg = pb.ProfilesDictionary()
        d = self.msg
        d.string_table.append("")
        tables = (d.mapping_table, d.location_table, d.function_table, d.link_table, d.attribute_table, d.stack_table)
        for table in tables:
            table.add()
        self._strings: dict[str, int] = {"": 0}
        self._locations: dict[Frame, int] = {}
        self._stacks: dict[tuple[Frame, ...], int] = {}
        self._links: dict[tuple[bytes, bytes], int] = {}

    def string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self.msg.string_table)
            self.msg.string_table.append(text)
        return index

    def location(self, f: Frame) -> int:
        index = self._locations.get(f)
        if index is None:
            function = len(self.msg.function_table)
            self.msg.function_table.add(name_strindex=self.string(f.name), filename_strindex=self.string(f.file))
            index = self._locations[f] = len(self.msg.location_table)
            self.msg.location_table.add(lines=[pb.Line(function_index=function, line=f.line)])
        return index

    def stack(self, frames: tuple[Frame, ...]) -> int:
        index = self._stacks.get(frames)
        if index is None:
            leaf_first = [self.location(f) for f in reversed(frames)]
            index = self._stacks[frames] = len(self.msg.stack_table)
            self.msg.stack_table.add(location_indices=leaf_first)
        return index

    def link(self, step: LiveStep | None) -> int:
        if step is None:
            return 0
        key = (step.trace_id, step.span_id)
        index = self._links.get(key)
        if index is None:
            index = self._links[key] = len(self.msg.link_table)
            self.msg.link_table.add(trace_id=step.trace_id, span_id=step.span_id)
        return index


def _ref_profile_id(window: str, kind: str) -> bytes:
    return hashlib.sha256(f"otelprof profile\0{window}\0{kind}".encode()).digest()[:16]


def ref_otlp_request(
    found: Samples, live: Mapping[int, LiveStep], resource: Attrs, scope_version: str, window: str
) -> bytes:
    """An ``ExportProfilesServiceRequest``: ``live`` maps step numbers to their train.step spans."""
    d = _RefDictionary()
    profiles = []
    for kind, values in ((CPU, found.cpu), (DEVICE, found.device)):
        if kind == DEVICE and not values:
            continue
        profile = pb.Profile(
            sample_type=pb.ValueType(type_strindex=d.string(kind), unit_strindex=d.string(UNIT)),
            time_unix_nano=found.start_ns,
            duration_nano=found.end_ns - found.start_ns,
            profile_id=_ref_profile_id(window, kind),
        )
        for (frames, step), ns in sorted(values.items(), key=_order):
            if ns:
                link = d.link(live.get(step) if step is not None else None)
                profile.samples.add(stack_index=d.stack(frames), link_index=link, values=[ns])
        profiles.append(profile)
    scope = pb.ScopeProfiles(scope=InstrumentationScope(name="otelprof", version=scope_version), profiles=profiles)
    rp = pb.ResourceProfiles(resource=Resource(attributes=attributes(resource)), scope_profiles=[scope])
    return ExportProfilesServiceRequest(resource_profiles=[rp], dictionary=d.msg).SerializeToString()


def _order(item: tuple[Key, int]) -> tuple[tuple[str, ...], int]:
    (frames, step), _ns = item
    return tuple(f.label for f in frames), -1 if step is None else step


# --- pprof (profile.proto) ------------------------------------------------------------------


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 as two's complement, as protobuf writes it
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _packed(number: int, values: list[int]) -> bytes:
    return _field(number, b"".join(_varint(v) for v in values)) if values else b""


def ref_pprof(found: Samples) -> bytes:
    """A gzipped pprof profile: sample types cpu and device (nanoseconds), one sample per stack
    and step (label ``step``), locations leaf first."""
    strings: dict[str, int] = {"": 0}

    def s(text: str) -> int:
        return strings.setdefault(text, len(strings))

    frames: dict[Frame, int] = {}
    merged: dict[Key, list[int]] = {}
    for k, values in enumerate((found.cpu, found.device)):
        for key, ns in values.items():
            if ns:
                merged.setdefault(key, [0, 0])[k] += ns
    out = bytearray()
    for kind in (CPU, DEVICE):
        out += _field(1, _int(1, s(kind)) + _int(2, s(UNIT)))
    step_key = s("step")
    for (stack, step), pair in sorted(merged.items(), key=lambda kv: _order((kv[0], 0))):
        ids = [frames.setdefault(f, len(frames) + 1) for f in reversed(stack)]
        label = _field(3, _int(1, step_key) + _int(3, step)) if step is not None else b""
        out += _field(2, _packed(1, ids) + _packed(2, pair) + label)
    for f, ident in frames.items():
        out += _field(4, _int(1, ident) + _field(4, _int(1, ident) + _int(2, f.line)))
        out += _field(5, _int(1, ident) + _int(2, s(f.name)) + _int(3, s(f.name)) + _int(4, s(f.file)))
    for text in strings:  # insertion order: the indices handed out
        out += _field(6, text.encode())
    out += _int(9, found.start_ns) + _int(10, found.end_ns - found.start_ns)
    out += _field(11, _int(1, s(CPU)) + _int(2, s(UNIT)))
    out += _int(14, s(CPU))  # default_sample_type: viewers open CPU self time (speedscope: else the last)
    # strings added after the table was written would be lost: every one is taken above
    return gzip.compress(bytes(out), 6, mtime=0)


def ref_collapsed(values: Iterable[tuple[tuple[tuple[Frame, ...], int | None], int]]) -> str:
    """Brendan Gregg's folded format (``frame;frame;frame value``, root first), steps merged,
    one line per stack in sorted order; ``;`` and line breaks in names become spaces."""
    merged: dict[str, int] = {}
    for (stack, _step), ns in values:
        line = ";".join(_fold(f.label) for f in stack)
        merged[line] = merged.get(line, 0) + ns
    return "".join(f"{line} {ns}\n" for line, ns in sorted(merged.items()) if ns)


def _fold(label: str) -> str:
    return re.sub(r"[;\r\n]", " ", label) or "?"


# --- the tests ---


def _same_everywhere(found: Samples, live: Mapping[int, LiveStep]) -> None:
    resource: Attrs = [("service.name", "train"), ("otelprof.run.id", "r")]
    new = encode.otlp_request(found, live, resource, "1.2", "w7")
    assert new == ref_otlp_request(found, live, resource, "1.2", "w7")
    assert encode.pprof(found) == ref_pprof(found)
    for values in (found.cpu, found.device):
        assert stacks.collapsed(values.items()) == ref_collapsed(values.items())


def _steps(found: Samples) -> dict[int, LiveStep]:
    numbers = {step for values in (found.cpu, found.device) for _, step in values if step is not None}
    return {n: LiveStep(n, (n + 1).to_bytes(16, "big"), (n + 2).to_bytes(8, "big")) for n in numbers}


@pytest.mark.parametrize(
    "fragment", ["h100__gaunernst_bert", "mi300__ddp_resnet18", "df_index_resolver", "critical_path__alexnet"]
)
def test_the_encoders_write_what_the_reference_wrote_on_real_traces(fragment: str) -> None:
    from converter_helpers import shared_trace

    found = stacks.samples(gzip.decompress(shared_trace(fragment).read_bytes()))
    assert found.cpu and found.device
    steps = _steps(found)
    _same_everywhere(found, steps)
    _same_everywhere(found, {})  # no train.step spans: no links
    # and decoded: every sample's stack and value are there, in the reference's order
    request = ExportProfilesServiceRequest.FromString(encode.otlp_request(found, steps, [], "1", "w"))
    [scope] = request.resource_profiles[0].scope_profiles
    assert sum(v for s in scope.profiles[0].samples for v in s.values) == found.cpu_total_ns
    assert [request.dictionary.string_table[p.sample_type.type_strindex] for p in scope.profiles] == [CPU, DEVICE]


# names whose labels match another frame's ("f(3): g" is how Frame("g", "f", 3) shows), folded characters
_NAMES = st.sampled_from(["a", "b", "f(3): g", "g", "x;y", "l\nm", "", "ProfilerStep*", "é"])
_FRAMES = st.builds(Frame, _NAMES, st.sampled_from(["", "f", "t.py"]), st.sampled_from([0, 3, 200, 70000]))
_VALUES = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, 127, 128, 16383, 16384]))
_STEPS = st.one_of(st.none(), st.integers(0, 20), st.just(2**40))


@settings(max_examples=300, deadline=None)
@given(
    stack_list=st.lists(st.lists(_FRAMES, max_size=6), min_size=1, max_size=12),
    cpu=st.lists(st.tuples(st.integers(0, 11), _STEPS, _VALUES), max_size=30),
    device=st.lists(st.tuples(st.integers(0, 11), _STEPS, _VALUES), max_size=10),
    linked=st.sets(st.integers(0, 20)),
    times=st.tuples(st.integers(0, 2**62), st.integers(0, 2**61)),
)
def test_the_encoders_write_what_the_reference_wrote_on_generated_samples(
    stack_list: list[list[Frame]],
    cpu: list[tuple[int, int | None, int]],
    device: list[tuple[int, int | None, int]],
    linked: set[int],
    times: tuple[int, int],
) -> None:
    def values(rows: list[tuple[int, int | None, int]]) -> dict[Key, int]:
        # a fresh tuple per row: equal stacks that are distinct objects must still be one
        return {(tuple(stack_list[k % len(stack_list)]), step): ns for k, step, ns in rows}

    found = Samples(values(cpu), values(device), times[0], times[0] + times[1])
    # two steps share a span (one link); the rest have their own
    live = {n: LiveStep(n, bytes([n // 2 + 1]) * 16, bytes([n // 2 + 1]) * 8) for n in linked}
    _same_everywhere(found, live)


def test_frames_that_show_alike_order_their_samples_by_step_as_the_reference() -> None:
    # Frame("g", "f", 3) shows as "f(3): g", as the operator Frame("f(3): g") does: the order is
    # by label, then step, so their samples interleave by step whatever order they came in
    python, operator = (Frame("g", "f", 3),), (Frame("f(3): g"),)
    assert python[0].label == operator[0].label
    cpu = {(python, 5): 10, (operator, 3): 20, (python, None): 30, (operator, 4): 0, ((), 1): 5}
    found = Samples(cpu, {(operator, 5): 7, ((Frame("k;\n"),), None): 1}, 100, 250)
    _same_everywhere(found, {3: LiveStep(3, b"\1" * 16, b"\2" * 8), 5: LiveStep(5, b"\1" * 16, b"\2" * 8)})
    request = ExportProfilesServiceRequest.FromString(encode.otlp_request(found, {}, [], "1", "w"))
    [scope] = request.resource_profiles[0].scope_profiles
    assert [list(s.values) for s in scope.profiles[0].samples] == [[5], [30], [20], [10]]


def test_a_live_window_is_sent_and_written_as_the_reference_encodes_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from export.receivers import http_receiver, wait_until

    from capture import live_session
    from capture.test_profiles import ONE_WINDOW, _train_a_little
    from otelprof.capture.windows import keep

    folder = tmp_path / "traces"
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp_path / "spool", **ONE_WINDOW, OTELPROF_TRACE_DIR=str(folder))
        _train_a_little()
        live_session.stop(session)
        wait_until(lambda: bool(rec.profile_requests), 30)
    [request] = rec.profile_requests
    [kept] = folder.glob(f"*{keep.SUFFIX}")
    found = stacks.samples(gzip.decompress(kept.read_bytes()))
    assert found.cpu_total_ns > 0
    # the steps the window linked: on a loaded machine a window now and then links one of its two
    # steps only (its live steps are the conversion's input, not the encoders' concern)
    sent_links = {(link.trace_id, link.span_id) for link in request.dictionary.link_table}
    steps = {}
    for span in rec.spans:
        if span.name == "train.step" and (span.trace_id, span.span_id) in sent_links:
            number = {kv.key: kv.value.int_value for kv in span.attributes}["otelprof.step.number"]
            steps[number] = LiveStep(number, span.trace_id, span.span_id)
    assert steps
    _same_everywhere(found, steps)
    # what the receiver got: the reference's request for the window (its resource, scope and ids as sent)
    [scope] = request.resource_profiles[0].scope_profiles
    resource: Attrs = [(kv.key, kv.value.string_value) for kv in request.resource_profiles[0].resource.attributes]
    expected = ExportProfilesServiceRequest.FromString(
        ref_otlp_request(found, steps, resource, scope.scope.version, "w")
    )
    assert request.dictionary == expected.dictionary
    [sent], [ours] = scope.profiles, expected.resource_profiles[0].scope_profiles[0].profiles
    assert list(sent.samples) == list(ours.samples) and sent.sample_type == ours.sample_type
    stem = kept.name.removesuffix(keep.SUFFIX)
    assert (folder / (stem + ".pprof.gz")).read_bytes() == ref_pprof(found)
    assert (folder / (stem + ".collapsed.txt")).read_text() == ref_collapsed(found.cpu.items())
