"""Structure-aware fuzzing with hypothesis: mutations of real traces either convert (and
then decode as valid OTLP that keeps the converter's own invariants) or raise
TraceFormatError. Any other exception, or a crash, is a bug.

10,800 examples in all when the native core is built (it is fast): 5,000 native,
2,000 native-vs-reference, 3,000 byte-damaged whole files (native), and 800 on the
reference alone (marked slow). The fast loop, ``pytest -m "not slow"``, runs each
property on QUICK examples. Derandomised, so every run is the same run.
"""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from converter_helpers import decode_requests, shared_trace, skip_unless_native
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otelprof.converter import ConvertResult, TraceFormatError, convert

CORPUS = ["cpu_only__rank-34", "amd_trace__mi250", "critical_path__alexnet", "dlrm_kineto__worker0"]
MAX_SLICE = 120


@cache
def _corpus() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(gzip.decompress(shared_trace(f).read_bytes())) for f in CORPUS)


def _settings(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


# --- the mutation language ----------------------------------------------------------------------

KEYS = ["ph", "ts", "dur", "name", "cat", "pid", "tid", "args", "id", "s", "bp"]
ARG_KEYS = [
    "correlation", "External id", "Sequence number", "Fwd thread id", "Input Dims", "Input type", "device",
    "stream", "grid", "Bytes", "Total Allocated", "Device Type", "flops", "Call stack", "Module Hierarchy",
    "blocks per SM", "est. achieved occupancy %", "kind", "Collective name", "Record function id",
]  # fmt: skip
PHASES = ["X", "i", "I", "s", "f", "t", "M", "B", "E", "C", "", "x", "XX"]
CATEGORIES = [
    "cpu_op", "Operator", "user_annotation", "python_function", "cuda_runtime", "Runtime", "cuda_driver", "Trace",
    "kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation", "fwdbwd", "ac2g",
    "async", "async_cpu_to_gpu", "cpu_instant_event", "", "unknown_cat",
]  # fmt: skip
NAMES = [
    "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#", "ProfilerStep#-3", "ProfilerStep#99999999999999999999",
    "ProfilerStep#007", "[memory]", "aten::add", "", "x\ud800y", "\U0001f600", "PyTorch Profiler (0)",
]  # fmt: skip
TOP_KEYS = ["traceEvents", "baseTimeNanoseconds", "distributedInfo", "deviceProperties", "trace_id", "traceName"]

weird_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63), 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.5, -0.5, 1e-30, 1e-300, 1e15, 1e16, 1e300, -1e300, 4.0000005, 2.5e-4]),
    st.text(max_size=8),
    st.sampled_from(["123", "-7", "0", "-0", "01", "1.5", "", "Spans", "\ud800", "\udfff\ud800", "nan"]),
)
weird_values = st.one_of(
    weird_scalars,
    st.lists(weird_scalars, max_size=3),
    st.dictionaries(st.sampled_from([*ARG_KEYS, "name", "rank", "world_size"]), weird_scalars, max_size=3),
)

# one mutation: (what, which event (mod len), which key, a value)
mutation = st.tuples(
    st.sampled_from(
        ["drop_key", "set_key", "set_arg", "drop_arg", "dup_event", "del_event", "set_ph", "set_cat", "set_name",
         "shift_ts", "copy_corr", "set_top", "drop_top", "nest_value"]
    ),
    st.integers(min_value=0, max_value=2**16),
    st.integers(min_value=0, max_value=2**16),
    weird_values,
)  # fmt: skip


def _apply(doc: dict[str, Any], muts: list[tuple[str, int, int, Any]]) -> Any:
    events = doc["traceEvents"]
    for what, i, k, value in muts:
        ev = events[i % len(events)] if events else None
        if what == "drop_key" and isinstance(ev, dict):
            ev.pop(KEYS[k % len(KEYS)], None)
        elif what == "set_key" and isinstance(ev, dict):
            ev[KEYS[k % len(KEYS)]] = value
        elif what == "set_arg" and isinstance(ev, dict):
            args = ev.get("args")
            if not isinstance(args, dict):
                args = ev["args"] = {}
            args[ARG_KEYS[k % len(ARG_KEYS)]] = value
        elif what == "drop_arg" and isinstance(ev, dict) and isinstance(ev.get("args"), dict):
            ev["args"].pop(ARG_KEYS[k % len(ARG_KEYS)], None)
        elif what == "dup_event" and ev is not None:
            events.insert(k % (len(events) + 1), copy.deepcopy(ev))
        elif what == "del_event" and events:
            del events[i % len(events) : i % len(events) + 1 + k % 3]
        elif what == "set_ph" and isinstance(ev, dict):
            ev["ph"] = PHASES[k % len(PHASES)]
        elif what == "set_cat" and isinstance(ev, dict):
            ev["cat"] = CATEGORIES[k % len(CATEGORIES)]
        elif what == "set_name" and isinstance(ev, dict):
            ev["name"] = NAMES[k % len(NAMES)]
        elif what == "shift_ts" and isinstance(ev, dict) and isinstance(ev.get("ts"), (int, float)):
            other = events[k % len(events)]
            if isinstance(other, dict) and isinstance(other.get("ts"), (int, float)):
                ev["ts"] = other["ts"] + (k % 7 - 3) * 0.001  # collide or nearly collide with another event
        elif what == "copy_corr" and isinstance(ev, dict):
            other = events[k % len(events)]
            if isinstance(other, dict) and isinstance(other.get("args"), dict) and isinstance(ev.get("args"), dict):
                for key in ("correlation", "External id", "Sequence number"):
                    if key in other["args"]:
                        ev["args"][key] = other["args"][key]
                if "id" in other:
                    ev["id"] = other["id"]
        elif what == "set_top":
            doc[TOP_KEYS[1 + k % (len(TOP_KEYS) - 1)] if k % 11 else "traceEvents"] = value
            if not isinstance(doc.get("traceEvents"), list):
                return doc
        elif what == "drop_top":
            doc.pop(TOP_KEYS[k % len(TOP_KEYS)], None)
            if "traceEvents" not in doc:
                return doc
        elif what == "nest_value" and isinstance(ev, dict):
            ev.setdefault("args", {})
            if isinstance(ev["args"], dict):
                ev["args"]["Input Dims"] = json.loads("[" * (1 + k % 40) + "]" * (1 + k % 40))
        if not isinstance(doc.get("traceEvents"), list):
            return doc
        events = doc["traceEvents"]
    return doc


@st.composite
def mutated_traces(draw: st.DrawFn, max_slice: int = MAX_SLICE) -> bytes:
    corpus = _corpus()
    base = corpus[draw(st.integers(0, len(corpus) - 1))]
    events = base["traceEvents"]
    start = draw(st.integers(0, max(0, len(events) - 1)))
    length = draw(st.integers(0, max_slice))
    doc = {k: copy.deepcopy(v) for k, v in base.items() if k != "traceEvents"}
    doc["traceEvents"] = copy.deepcopy(events[start : start + length])
    if draw(st.booleans()):  # keep the step annotation so step logic runs on the slice
        doc["traceEvents"].extend(
            copy.deepcopy([e for e in events if str(e.get("name", "")).startswith("ProfilerStep")])
        )
    doc = _apply(doc, draw(st.lists(mutation, min_size=0, max_size=6)))
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), allow_nan=True)
    data = text.encode("utf-8", "surrogatepass")
    byte_ops = []
    if draw(st.integers(0, 3)) == 0:  # a quarter of the inputs also get byte-level damage
        byte_ops = draw(st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert"]), st.integers(0, 2**20),
                                           st.integers(0, 255)), min_size=1, max_size=2))  # fmt: skip
    for what, pos, byte in byte_ops:
        if not data:
            break
        pos %= len(data)
        if what == "flip":
            data = data[:pos] + bytes([data[pos] ^ (byte or 1)]) + data[pos + 1 :]
        elif what == "cut":
            data = data[:pos]
        else:
            data = data[:pos] + bytes([byte]) + data[pos:]
    if draw(st.integers(0, 9)) == 0:
        data = gzip.compress(data, mtime=0)
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
    return data


options_st = st.fixed_dictionaries(
    {
        "detail": st.sampled_from(["full", "default"]),
        "max_request_bytes": st.sampled_from([1024, 4096, 3 * 1024 * 1024]),
        "min_duration_ns": st.sampled_from([0, 10_000]),
        "event_limit": st.sampled_from([0, 1, 128]),
        "link_limit": st.sampled_from([0, 1, 128]),
        "split_world_size": st.sampled_from([0, 2, 4]),
        # by record function id (the corpus has 0 and 35-73), as an execution trace gives them
        "op_attributes": st.dictionaries(
            st.integers(-1, 80),
            st.lists(
                st.tuples(
                    st.sampled_from(["otelprof.et.node_id", "otelprof.et.input_shapes", "k"]),
                    st.one_of(
                        st.integers(-(2**63), 2**63 - 1), st.text(max_size=6), st.booleans(), st.floats(allow_nan=False)
                    ),
                ),
                max_size=3,
            ),
            max_size=8,
        ),
    }
)


# --- the property ---------------------------------------------------------------------------------


def _convert_or_reject(data: bytes, engine: str, opts: dict[str, Any]) -> ConvertResult | None:
    try:
        result = convert(data, engine=engine, **opts)
    except TraceFormatError as exc:
        assert str(exc), "a TraceFormatError says why"
        return None
    _check(result, opts)
    return result


def _check(result: ConvertResult, opts: dict[str, Any]) -> None:
    st_ = result.stats
    messages = decode_requests(result.requests)  # must be valid OTLP
    assert st_["requests"] == len(messages)
    n_spans = 0
    seen: set[bytes] = set()
    for raw, msg in zip(result.requests, messages, strict=True):
        spans = msg.resource_spans[0].scope_spans[0].spans
        assert len(spans) >= 1
        assert len(raw) <= opts["max_request_bytes"] or len(spans) == 1, (
            "only a lone oversized span may exceed the limit"
        )
        for s in spans:
            assert len(s.trace_id) == 16 and len(s.span_id) == 8
            assert s.span_id not in seen
            seen.add(s.span_id)
            assert s.end_time_unix_nano >= s.start_time_unix_nano
        n_spans += len(spans)
    assert st_["spans"] == n_spans
    kept = st_["spans"] - st_["synthetic_spans"] - st_["aggregate_spans"]
    dropped = ("dropped_python", "dropped_short", "dropped_budget", "dropped_step_copies", "dropped_outside_step")
    hidden = sum(st_[k] for k in dropped)
    assert kept + hidden + st_["dropped_window_roots"] + st_["aggregated_events"] == st_["complete_events"]
    for op in result.ops:
        assert op.calls >= 1 and op.kind in ("op", "annotation", "device")


def _agree(data: bytes, opts: dict[str, Any]) -> None:
    outcome = []
    for engine in ("native", "reference"):
        outcome.append(_convert_or_reject(data, engine, opts))
    native, reference = outcome
    assert (native is None) == (reference is None), (
        f"native {'rejected' if native is None else 'accepted'} what the reference "
        f"{'rejected' if reference is None else 'accepted'}"
    )
    if native is not None and reference is not None:
        assert decode_requests(native.requests) == decode_requests(reference.requests)
        assert native.requests == reference.requests
        assert native.stats == reference.stats
        assert native.ops == reference.ops


# --- the tests --------------------------------------------------------------------------------------


# Each property runs twice in the full suite: at its full example count (marked slow) and at a
# small count (QUICK) that keeps it in the fast loop, ``pytest -m "not slow"``. Each run is built
# by _runner(n, ...) from the same check and strategies; derandomised, so each is the same run.

QUICK = 40


def _runner(n: int, check: Callable[..., None], **strategies: st.SearchStrategy[Any]) -> Callable[[], None]:
    runner: Callable[[], None] = _settings(n)(given(**strategies)(check))
    return runner


def _reference(data: bytes, opts: dict[str, Any]) -> None:
    _convert_or_reject(data, "reference", opts)


def _native(data: bytes, opts: dict[str, Any]) -> None:
    _convert_or_reject(data, "native", opts)


def _whole_file_bytes(which: int, flips: list[tuple[int, int]], cut: int | None, gz: bool) -> None:
    """Byte flips and truncation of whole (small) files, raw or gzipped."""
    path = shared_trace(CORPUS[which])
    data = bytearray(path.read_bytes() if gz else gzip.decompress(path.read_bytes()))
    for pos, xor in flips:
        data[pos % len(data)] ^= xor
    if cut is not None:
        del data[cut % len(data) :]
    _convert_or_reject(bytes(data), "native", {"detail": "full", "max_request_bytes": 3 * 1024 * 1024})


def _fuzz_reference(n: int) -> Callable[[], None]:
    return _runner(n, _reference, data=mutated_traces(max_slice=60), opts=options_st)


def _fuzz_native(n: int) -> Callable[[], None]:
    return _runner(n, _native, data=mutated_traces(), opts=options_st)


def _fuzz_agree(n: int) -> Callable[[], None]:
    return _runner(n, _agree, data=mutated_traces(max_slice=40), opts=options_st)


def _fuzz_whole_file_bytes(n: int) -> Callable[[], None]:
    return _runner(
        n,
        _whole_file_bytes,
        which=st.integers(0, len(CORPUS) - 1),
        flips=st.lists(st.tuples(st.integers(0, 2**24), st.integers(1, 255)), min_size=1, max_size=4),
        cut=st.one_of(st.none(), st.integers(0, 2**24)),
        gz=st.booleans(),
    )


# --- the tests --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fuzz_reference() -> None:
    _fuzz_reference(800)()


def test_fuzz_reference_quick() -> None:
    _fuzz_reference(QUICK)()


@pytest.mark.slow
def test_fuzz_native() -> None:
    skip_unless_native()
    _fuzz_native(5000)()


def test_fuzz_native_quick() -> None:
    skip_unless_native()
    _fuzz_native(QUICK)()


@pytest.mark.slow
def test_fuzz_native_agrees_with_reference() -> None:
    skip_unless_native()
    _fuzz_agree(2000)()


def test_fuzz_native_agrees_with_reference_quick() -> None:
    skip_unless_native()
    _fuzz_agree(QUICK)()


@pytest.mark.slow
def test_fuzz_whole_file_bytes() -> None:
    skip_unless_native()
    _fuzz_whole_file_bytes(3000)()


def test_fuzz_whole_file_bytes_quick() -> None:
    skip_unless_native()
    _fuzz_whole_file_bytes(QUICK)()
