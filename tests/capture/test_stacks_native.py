"""The flame graphs' stacks pass in the native core (``_native.stack_samples``, GIL released)
against its Python reference (capture/profiles/stacks.py ``samples``): the same ``Samples``, in the
same dict order, on every shared Kineto trace, on a fresh with_stack recording of the installed
torch, on hand-made edge cases, on generated traces and on mutations of real ones."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from converter.test_fuzz import mutated_traces
from converter_helpers import native_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otelprof._native_module import native
from otelprof.capture.profiles import stacks
from otelprof.converter import TraceFormatError
from otelprof.converter.reference.reader import read

KINETO = Path(__file__).resolve().parents[3] / "shared" / "traces" / "kineto"


@pytest.fixture(autouse=True)
def _needs_native() -> None:
    native_module()  # skips without it, fails where CI requires it


def _same(native_found: stacks.Samples, reference: stacks.Samples) -> None:
    assert native_found == reference
    # the dicts' order too: what the pprof and OTLP encoders iterate
    assert list(native_found.cpu.items()) == list(reference.cpu.items())
    assert list(native_found.device.items()) == list(reference.device.items())


def _both(data: bytes, base_time_ns: int | None = None) -> stacks.Samples:
    found = stacks.native_samples(data, base_time_ns)
    _same(found, stacks.samples(data, base_time_ns))
    return found


# --- the shared traces and a fresh recording -------------------------------------------------------


@pytest.mark.parametrize("path", sorted(KINETO.glob("*.json.gz")), ids=lambda p: p.name.split(".")[0][-40:])
def test_every_shared_trace_gives_the_reference_samples(path: Path) -> None:
    data = gzip.decompress(path.read_bytes())
    found = _both(data)
    assert found.cpu_total_ns > 0 and found.end_ns > found.start_ns


@pytest.mark.parametrize("fragment", ["amd_trace__mi250", "h100__gaunernst_bert", "nccl_parser_config"])
def test_the_time_base_override(fragment: str) -> None:
    [path] = KINETO.glob(f"*{fragment}*")
    data = gzip.decompress(path.read_bytes())
    found = _both(data, 123)
    assert found.start_ns >= 123 and found.start_ns != stacks.native_samples(data).start_ns


def test_the_shared_traces_with_python_stacks_keep_their_frames() -> None:
    [path] = KINETO.glob("*h100__gaunernst_bert*")
    found = _both(gzip.decompress(path.read_bytes()))
    frames = {f for stack, _ in found.cpu for f in stack}
    assert stacks.Frame("spawn_main", "multiprocessing/spawn.py", 122) in frames
    assert stacks.Frame("ProfilerStep*") in frames
    assert any(step is not None for _, step in found.device)


def test_a_fresh_with_stack_recording_of_this_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step() -> None:
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    def other_thread() -> None:  # operators with no ProfilerStep of their own: steps by time
        worker = threading.Thread(target=lambda: torch.ones(4).add(1))
        worker.start()
        worker.join()

    path = tmp_path / "trace.json"
    when = schedule(wait=0, warmup=1, active=3, repeat=1)
    ready = lambda p: p.export_chrome_trace(str(path))  # noqa: E731
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, schedule=when, on_trace_ready=ready) as prof:
        for _ in range(4):
            train_step()
            other_thread()
            prof.step()
    found = stacks.samples_from_file(str(path))  # native: the module is there
    _same(found, stacks.samples(path.read_bytes()))
    here = [f for stack, _ in found.cpu for f in stack if f.file.endswith("test_stacks_native.py")]
    assert {f.name for f in here} >= {"train_step", "test_a_fresh_with_stack_recording_of_this_torch"}
    assert len({step for _, step in found.cpu} - {None}) == 3
    assert all(f.line > 0 for f in here)


# --- edge cases by hand ----------------------------------------------------------------------------


def _trace(events: list[dict[str, Any]], **top: Any) -> bytes:
    return json.dumps({"traceEvents": events, **top}).encode()


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int | str = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_python_frame_names_split_as_the_reference_splits_them() -> None:
    names = [
        "a.py(3): f", "x(1): y(22): z", "f(1234567890123456789): g", "f(123456789012345678): g", "(1): ",
        "p(0): ", "f(1):g", "f(1): (2): h", "<built-in method mean of Tensor object at 0x7fAb12>",
        "<m at 0x>", "<m at 0xzz>", "m at 0x12> ", "k\u00e9(2): \u00fc(3)", "ProfilerStep#1", "",
    ]  # fmt: skip
    events = [_x(n, 10 * k, 5, cat="python_function") for k, n in enumerate(names)]
    found = _both(_trace(events))
    got = {stack[-1] for stack, _ in found.cpu}
    assert stacks.Frame("z", "x(1): y", 22) in got
    assert stacks.Frame("g", "f", 123456789012345678) in got
    assert stacks.Frame("f(1234567890123456789): g") in got  # over 18 digits: not a line number
    assert stacks.Frame("<built-in method mean of Tensor object>") in got
    assert stacks.Frame("ProfilerStep#1") in got  # a Python frame keeps its name


def test_negative_self_times_and_steps_by_time_on_another_thread() -> None:
    events = [
        _x("ProfilerStep#7", 0, 100, cat="user_annotation"),
        _x("a.py(1): outer", 0, 100, cat="python_function"),
        _x("ProfilerStep#0008", 100, 100, cat="user_annotation"),  # leading zeros: step 8
        _x("ProfilerStep#1234567890123456789", 100, 5, cat="user_annotation"),  # 19 digits: no step
        # children that overlap each other: the parent's self time is negative
        _x("aten::mm", 10, 60, tid=1),
        _x("aten::add", 30, 60, tid=1),
        _x("cudaLaunchKernel", 35, 5, cat="cuda_runtime", correlation=4),
        _x("gemm", 150, 20, cat="kernel", tid="stream 7", correlation=4),
        _x("orphan", 160, 3, cat="kernel", tid="stream 7", correlation=99),
        _x("aten::relu", 120, 10, tid=2),  # no step above: the one running then
        _x("aten::zero_", 300, 10, tid=2),  # outside every step
    ]
    found = _both(_trace(events, baseTimeNanoseconds=1000))
    assert min(found.cpu.values()) >= 0
    steps = {stack[-1].name: step for stack, step in found.cpu}
    assert steps["aten::relu"] == 8 and steps["aten::zero_"] is None and steps["aten::add"] == 7
    assert {stack[0].name for stack, _ in found.device} == {"ProfilerStep*", stacks.UNATTRIBUTED}
    assert (found.start_ns, found.end_ns) == (1000, 1000 + 310_000)


def test_sums_past_int64_stay_exact() -> None:
    big = 6 * 10**15  # µs: 6e18 ns each, two of them past 2**63
    events = [
        _x("parent", 0, 9_200_000_000_000_000),
        _x("a", 0, big),
        _x("b", 10**15, big),
        _x("cudaLaunchKernel", 0, 1, cat="cuda_runtime", correlation=1),
        _x("k", 0, big, cat="kernel", tid="s", correlation=1),
        _x("k", 10**15, big, cat="kernel", tid="s", correlation=1),
    ]
    found = _both(_trace(events))
    assert max(found.device.values()) == 2 * big * 1000 > 2**63


def test_what_the_converter_rejects_the_native_pass_rejects() -> None:
    assert native is not None
    for data in (b"", b"[", b'{"traceEvents": 3}', _trace([_x("a", -5, 1)]), _trace([_x("a", 1, -1)])):
        with pytest.raises(native.TraceError):
            stacks.native_samples(data)
    assert stacks.native_samples(b"[]") == stacks.samples(b"[]") == stacks.Samples({}, {}, 0, 0)


# --- generated and mutated traces --------------------------------------------------------------------

CATEGORIES = ["cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "kernel",
              "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Trace", "cpu_instant_event", "other"]  # fmt: skip
NAMES = ["aten::mm", "aten::is_leaf", "[memory]", "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#02",
         "ProfilerStep#", "a.py(3): f", "b.py(4): g(5): h", "<built-in method x at 0xAB>",
         stacks.UNATTRIBUTED, "\U0001f600(1): \u00e9"]  # fmt: skip

generated_event = st.builds(
    _x,
    name=st.sampled_from(NAMES),
    ts=st.one_of(st.integers(0, 40), st.sampled_from([0.5, 2.0005, 7.25])),
    dur=st.one_of(st.integers(0, 40), st.sampled_from([0.0004, 1.5])),
    cat=st.sampled_from(CATEGORIES),
    tid=st.sampled_from([1, 2, "stream 7"]),
    correlation=st.integers(0, 6),
)


def _settings(n: int) -> settings:
    return settings(
        max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )


def _agree(data: bytes, base_time_ns: int | None) -> None:
    """Both give the same samples where the reference reader takes the trace; where it does
    not, the native pass (the converter's own reader) refuses it too."""
    assert native is not None
    try:
        read(data, base_time_ns)
    except TraceFormatError:
        with pytest.raises(native.TraceError):
            stacks.native_samples(data, base_time_ns)
        return
    _both(data, base_time_ns)


bases = st.sampled_from([None, 0, 123_456_789])


def _generated(n: int) -> Any:
    @_settings(n)
    @given(events=st.lists(generated_event, max_size=30), base=bases)
    def check(events: list[dict[str, Any]], base: int | None) -> None:
        _agree(_trace(events), base)

    return check


def _mutated(n: int) -> Any:
    @_settings(n)
    @given(data=mutated_traces(max_slice=60), base=bases)
    def check(data: bytes, base: int | None) -> None:
        _agree(data, base)

    return check


def test_generated_traces() -> None:
    _generated(300)()


def test_mutated_traces() -> None:
    _mutated(300)()


@pytest.mark.slow
def test_generated_traces_many() -> None:
    _generated(3000)()


@pytest.mark.slow
def test_mutated_traces_many() -> None:
    _mutated(2000)()
