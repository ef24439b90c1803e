"""Stack samples as an OTLP profiles request (``profiles/v1development``, the official classes)
and as a gzipped pprof ``profile.proto``.

OTLP: one ``Profile`` per sample type (the message holds one ``sample_type``): CPU self time and,
when the window ran device work, device time, both in nanoseconds, sharing the request's
``ProfilesDictionary`` (strings, functions, locations, stacks, links; entry 0 of each table the
empty value the specification asks for). Each sample links to its step's ``train.step`` span
and trace. pprof has no dictionary: its few fields are written here by hand (the format is
fixed: github.com/google/pprof/proto/profile.proto), both values on each sample.

Both run on the conversion thread holding the GIL beside training, so the work is done once per
distinct stack (a stack recurs once per step) and per distinct frame, and the repeated fields
are written as protobuf bytes here (the official classes parse them in C and write the request:
building a message per row was most of the time). tests/capture/test_profiles_encode.py pins
the output byte for byte to the row-by-row encoders this replaced.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterable, Mapping

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ...converter import LiveStep
from ...otlp.encoder import attributes
from ...otlp.spans import Attrs
from .stacks import Frame, Samples

UNIT = "nanoseconds"
CPU, DEVICE = "cpu", "device"  # sample types: CPU self time, device (kernel, memcpy, memset) time

Key = tuple[tuple[Frame, ...], int | None]


class _Stacks:
    """The distinct stacks of a window's samples, found by object first (the samples share one
    tuple per stack, so a key costs no deep hash) and then by value, so equal stacks made apart
    stay one; ``ids``: each one's frames, root first, as numbers into ``frames`` (the distinct
    frames), so the encoders look them up in lists. ``rank``: each stack's place in the order of
    its frames' labels, the order of both encodings' samples."""

    def __init__(self, found: Samples) -> None:
        self.stacks: list[tuple[Frame, ...]] = []
        self._by_value: dict[tuple[Frame, ...], int] = {}
        self._by_id: dict[int, int] = {}
        self._held: list[tuple[Frame, ...]] = []  # keeps every id in _by_id this object's own
        self.cpu = self._index(found.cpu)
        self.device = self._index(found.device)
        number: dict[Frame, int] = {}
        self.ids = [[number.setdefault(f, len(number)) for f in s] for s in self.stacks]
        self.frames = list(number)
        labels = [f.label for f in self.frames]
        keys = [tuple([labels[i] for i in ids]) for ids in self.ids]
        self.rank = [0] * len(keys)
        place, last = -1, None
        for k in sorted(range(len(keys)), key=keys.__getitem__):
            if keys[k] != last:  # equal labels (frames alike but for where the name came from) tie
                place, last = place + 1, keys[k]
            self.rank[k] = place

    def _index(self, values: Mapping[Key, int]) -> list[tuple[int, int | None, int]]:
        """(stack number, step, value) of each sample, in the mapping's order."""
        out = []
        by_id = self._by_id
        for (stack, step), ns in values.items():
            k = by_id.get(id(stack))
            if k is None:
                k = self._by_value.setdefault(stack, len(self.stacks))
                if k == len(self.stacks):
                    self.stacks.append(stack)
                by_id[id(stack)] = k
                self._held.append(stack)
            out.append((k, step, ns))
        return out

    def sort(self, rows: Iterable[tuple[int, int | None, int]]) -> list[tuple[int, int | None, int]]:
        """``rows`` by the stack's frames' labels, then the step (None first)."""
        rank = self.rank
        return sorted(rows, key=lambda r: (rank[r[0]], -1 if r[1] is None else r[1]))


def profile_id(window: str, kind: str) -> bytes:
    return hashlib.sha256(f"otelprof profile\0{window}\0{kind}".encode()).digest()[:16]


def otlp_request(
    found: Samples, live: Mapping[int, LiveStep], resource: Attrs, scope_version: str, window: str
) -> bytes:
    """An ``ExportProfilesServiceRequest``: ``live`` maps step numbers to their train.step spans."""
    st = _Stacks(found)
    strings: dict[str, int] = {"": 0}
    functions = [b""]  # Function and Location rows, one per frame: their indices are equal
    locations = [b""]
    location_of = [0] * len(st.frames)  # 0: not in the table yet
    stack_rows = [b""]
    stack_head: list[bytes | None] = [None] * len(st.stacks)  # Sample.stack_index field; None: not yet in the table
    links: dict[tuple[bytes, bytes], int] = {}
    link_rows = [b""]
    profiles = []
    for kind, rows in ((CPU, st.cpu), (DEVICE, st.device)):
        if kind == DEVICE and not rows:
            continue
        kind_s = strings.setdefault(kind, len(strings))
        unit_s = strings.setdefault(UNIT, len(strings))
        out = bytearray()
        link_of: dict[int | None, bytes] = {}  # each step's Sample.link_index field
        for k, step, ns in st.sort(rows):
            if not ns:
                continue
            link = link_of.get(step)
            if link is None:
                at = live.get(step) if step is not None else None
                index = 0
                if at is not None:
                    key = (at.trace_id, at.span_id)
                    index = links.get(key, 0)
                    if not index:
                        index = links[key] = len(link_rows)
                        link_rows.append(_bytes(1, at.trace_id) + _bytes(2, at.span_id))
                link = link_of[step] = _int(3, index)
            head = stack_head[k]
            if head is None:
                ids = []
                for j in reversed(st.ids[k]):
                    i = location_of[j]
                    if not i:
                        i = location_of[j] = len(locations)
                        f = st.frames[j]
                        name = strings.setdefault(f.name, len(strings))
                        file = strings.setdefault(f.file, len(strings))
                        functions.append(_int(1, name) + _int(3, file))
                        locations.append(_field(3, _int(1, i) + _int(2, f.line)))
                    ids.append(i)
                head = stack_head[k] = _int(1, len(stack_rows))
                stack_rows.append(_packed(1, ids))
            value = _varint(ns)
            row = b"".join((head, link, b"\x22", _VARINT[len(value)], value))  # values: packed, one
            out += b"\x12" + _small(len(row)) + row  # Profile.samples
        profile = pb.Profile.FromString(bytes(out))
        profile.sample_type.type_strindex = kind_s
        profile.sample_type.unit_strindex = unit_s
        profile.time_unix_nano = found.start_ns
        profile.duration_nano = found.end_ns - found.start_ns
        profile.profile_id = profile_id(window, kind)
        profiles.append(profile)
    table = bytearray(_field(1, b""))  # ProfilesDictionary: mapping_table, its entry 0 alone
    for number, rows_ in ((2, locations), (3, functions), (4, link_rows)):
        for row_ in rows_:
            table += _field(number, row_)
    for text in strings:  # insertion order: the indices handed out
        table += _field(5, text.encode())
    table += _field(6, b"")  # attribute_table: entry 0
    for row_ in stack_rows:
        table += _field(7, row_)
    scope = pb.ScopeProfiles(scope=InstrumentationScope(name="otelprof", version=scope_version), profiles=profiles)
    rp = pb.ResourceProfiles(resource=Resource(attributes=attributes(resource)), scope_profiles=[scope])
    dictionary = pb.ProfilesDictionary.FromString(bytes(table))
    return ExportProfilesServiceRequest(resource_profiles=[rp], dictionary=dictionary).SerializeToString()


# --- protobuf by hand (pprof, and OTLP's repeated fields) -------------------------------------


def _varint(n: int) -> bytes:
    if 0 <= n < _SMALL:
        return _VARINT[n]
    return _slow_varint(n & (1 << 64) - 1)  # int64 as two's complement, as protobuf writes it


def _slow_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = 1 << 12  # indices and lengths, looked up (the table: about 0.2 MB)
_VARINT = [_slow_varint(n) for n in range(_SMALL)]


def _small(n: int) -> bytes:
    return _VARINT[n] if n < _SMALL else _varint(n)


def _field(number: int, payload: bytes) -> bytes:
    return _VARINT[number << 3 | 2] + _small(len(payload)) + payload


def _bytes(number: int, payload: bytes) -> bytes:
    return _field(number, payload) if payload else b""


def _int(number: int, value: int) -> bytes:
    return _VARINT[number << 3] + _varint(value) if value else b""


def _packed(number: int, values: list[int]) -> bytes:
    return _field(number, b"".join([_varint(v) for v in values])) if values else b""


def pprof(found: Samples) -> bytes:
    """A gzipped pprof profile: sample types cpu and device (nanoseconds), one sample per stack
    and step (label ``step``), locations leaf first."""
    strings: dict[str, int] = {"": 0}

    def s(text: str) -> int:
        return strings.setdefault(text, len(strings))

    st = _Stacks(found)
    merged: dict[tuple[int, int | None], list[int]] = {}
    for k, rows in enumerate((st.cpu, st.device)):
        for stack, step, ns in rows:
            if ns:
                merged.setdefault((stack, step), [0, 0])[k] += ns
    out = bytearray()
    for kind in (CPU, DEVICE):
        out += _field(1, _int(1, s(kind)) + _int(2, s(UNIT)))
    step_key = _int(1, s("step"))
    frames: list[int] = []  # the distinct frames (``st.frames``' numbers) in pprof id order, from 1
    ident = [0] * len(st.frames)
    located: list[bytes | None] = [None] * len(st.stacks)  # each stack's packed location ids
    labels: dict[int | None, bytes] = {}
    for k, step, _ in st.sort([(k, step, 0) for k, step in merged]):
        ids = located[k]
        if ids is None:
            leaf_first = st.ids[k][::-1]
            for j in leaf_first:  # numbered as first met, leaf first
                if not ident[j]:
                    frames.append(j)
                    ident[j] = len(frames)
            ids = located[k] = _packed(1, [ident[j] for j in leaf_first])
        label = labels.get(step)
        if label is None:
            label = labels[step] = b"" if step is None else _field(3, step_key + _int(3, step))
        cpu, device = merged[k, step]
        values = _varint(cpu) + _varint(device)
        row = b"".join((ids, b"\x12", _VARINT[len(values)], values, label))
        out += b"\x12" + _small(len(row)) + row  # Profile.sample
    for n, j in enumerate(frames, 1):
        f = st.frames[j]
        out += _field(4, _int(1, n) + _field(4, _int(1, n) + _int(2, f.line)))
        name = s(f.name)
        out += _field(5, _int(1, n) + _int(2, name) + _int(3, name) + _int(4, s(f.file)))
    for text in strings:  # insertion order: the indices handed out
        out += _field(6, text.encode())
    out += _int(9, found.start_ns) + _int(10, found.end_ns - found.start_ns)
    out += _field(11, _int(1, s(CPU)) + _int(2, s(UNIT)))
    out += _int(14, s(CPU))  # default_sample_type: viewers open CPU self time (speedscope: else the last)
    # strings added after the table was written would be lost: every one is taken above
    return gzip.compress(bytes(out), 6, mtime=0)
