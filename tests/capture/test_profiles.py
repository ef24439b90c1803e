"""Flame graphs of with_stack windows (capture/profiles/): stack samples that sum exactly to the
window's key_averages self times, on shared GPU traces with Python stacks and on a live CPU
training loop; the OTLP profile decoded at a real receiver with the official classes, linked to
the steps' train.step spans; pprof and collapsed stacks beside the kept trace, the pprof opened in
speedscope in Chromium."""

from __future__ import annotations

import functools
import gzip
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prereqs
import pytest
from converter_helpers import shared_trace
from export.receivers import GrpcReceiver, HttpReceiver, grpc_receiver, http_receiver, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from prometheus_client import CollectorRegistry

from capture import live_session
from otelprof import convert
from otelprof.capture import profiles as otelprof_profiles
from otelprof.capture.profiles import WindowProfiles, encode, stacks
from otelprof.capture.windows import keep
from otelprof.converter import ConvertOptions, ConvertResult, LiveStep
from otelprof.converter.reference.jsonload import RawNumber, micros_to_ns
from otelprof.converter.reference.reader import read
from otelprof.export.config import exporter_config_from_env, profiles_config
from otelprof.export.exporter import Exporter
from otelprof.export.spool import Spool

torch = pytest.importorskip("torch")

#: shared traces with python_function events (with_stack) and device work, and two without stacks
SHARED = ["h100__gaunernst_bert", "mi300__ddp_resnet18", "critical_path__alexnet", "amd_trace__mi250"]
ONE_WINDOW = {
    **live_session.ONE_WINDOW,
    "OTELPROF_PROFILE_OPTIONS": "with_stack",
    "OTELPROF_RUN_ID": "flame",
}


def _self_times(result: ConvertResult) -> tuple[int, int]:
    """(CPU, device) self time of the window as key_averages has it."""
    cpu = sum(o.self_cpu_ns for o in result.ops if o.kind != "device")
    device = sum(o.self_device_ns for o in result.ops if o.kind == "device")
    return cpu, device


def _profiles(request: ExportProfilesServiceRequest) -> dict[str, Any]:
    """The request's profiles by sample type, every index checked against its table."""
    d = request.dictionary
    assert d.string_table[0] == "" and not d.link_table[0].trace_id and not d.stack_table[0].location_indices
    for table in (d.mapping_table, d.location_table, d.function_table, d.attribute_table):
        assert table[0].ByteSize() == 0  # every table's entry 0 is its zero value, present
    out = {}
    for rp in request.resource_profiles:
        for sp in rp.scope_profiles:
            assert sp.scope.name == "otelprof"
            for p in sp.profiles:
                assert d.string_table[p.sample_type.unit_strindex] == "nanoseconds"
                for s in p.samples:
                    assert 0 < s.stack_index < len(d.stack_table) and 0 <= s.link_index < len(d.link_table)
                    for loc in d.stack_table[s.stack_index].location_indices:
                        [line] = d.location_table[loc].lines
                        assert 0 < line.function_index < len(d.function_table)
                out[d.string_table[p.sample_type.type_strindex]] = p
    return out


def _frames(request: ExportProfilesServiceRequest, sample: Any) -> list[str]:
    """A sample's function names, root first."""
    d = request.dictionary
    locations = d.stack_table[sample.stack_index].location_indices
    names = [
        d.string_table[d.function_table[d.location_table[i].lines[0].function_index].name_strindex] for i in locations
    ]
    return names[::-1]


def _sum(profile: Any) -> int:
    return sum(v for s in profile.samples for v in s.values)


# --- shared traces ----------------------------------------------------------------------------


@pytest.mark.parametrize("fragment", SHARED)
def test_samples_sum_exactly_to_the_self_times_of_real_traces(fragment: str) -> None:
    path = shared_trace(fragment)
    found = stacks.samples(gzip.decompress(path.read_bytes()))
    result = convert(path)
    cpu, device = _self_times(result)
    assert (found.cpu_total_ns, found.device_total_ns) == (cpu, device)
    assert device > 0
    # the device time under a launching operator is the operators' self device time
    launched = sum(ns for (frames, _), ns in found.device.items() if frames[0].name != stacks.UNATTRIBUTED)
    assert launched == sum(o.self_device_ns for o in result.ops if o.kind != "device")
    # each kernel's time sits on its own name, under the stack that launched it
    kernels = {o.name: o.self_device_ns for o in result.ops if o.kind == "device"}
    by_leaf: dict[str, int] = {}
    for (frames, _), ns in found.device.items():
        by_leaf[frames[-1].name] = by_leaf.get(frames[-1].name, 0) + ns
    assert by_leaf == {k: v for k, v in kernels.items() if v or k in by_leaf}

    # where torch's self times are all >= 0 (no overlapping children), each operator's are its own
    names: dict[str, int] = {}
    for (frames, _), ns in found.cpu.items():
        names[frames[-1].label] = names.get(frames[-1].label, 0) + ns
    rows = {o.name: o.self_cpu_ns for o in result.ops if o.kind != "device"}
    if all(v >= 0 for v in rows.values()) and fragment != "h100__gaunernst_bert":  # (its names lose addresses)
        assert names == {k: v for k, v in rows.items() if v or k in names}

    request = ExportProfilesServiceRequest.FromString(encode.otlp_request(found, {}, [], "test", "w"))
    profiles = _profiles(request)
    assert (_sum(profiles["cpu"]), _sum(profiles["device"])) == (cpu, device)


@pytest.mark.parametrize("fragment", [*SHARED, "cpu_only__rank-34", "dlrm_kineto__worker0", "resnet50_autograd_api"])
def test_the_stacks_reader_reads_the_events_as_the_reference_reader(fragment: str) -> None:
    data = gzip.decompress(shared_trace(fragment).read_bytes())
    ours = stacks.events(data)
    theirs = read(data).events
    assert ours == theirs and len(ours) > 0
    assert stacks.events(data, 123) == read(data, 123).events


@settings(max_examples=500, deadline=None)
@given(
    whole=st.integers(0, 10**17),
    frac=st.text("0123456789", min_size=1, max_size=24),
    exponent=st.sampled_from(["", "e3", "E-2", "e+1"]),
    sign=st.sampled_from(["", "-"]),
)
def test_the_fast_time_conversion_is_micros_to_ns(whole: int, frac: str, exponent: str, sign: str) -> None:
    for value in (RawNumber(f"{sign}{whole}.{frac}{exponent}"), whole):
        assert _outcome(stacks.to_ns, value) == _outcome(lambda v: micros_to_ns(v, "time"), value)


def _outcome(convert_one: Any, value: Any) -> Any:
    """The value, or the error's text (out of range: both refuse it alike)."""
    try:
        return convert_one(value)
    except ValueError as exc:
        return str(exc)


def test_the_reference_engine_gives_the_same_self_times() -> None:
    path = shared_trace("amd_trace__mi250")
    found = stacks.samples(gzip.decompress(path.read_bytes()))
    assert (found.cpu_total_ns, found.device_total_ns) == _self_times(convert(path, engine="reference"))


def test_python_frames_carry_file_and_line_and_kernels_their_launching_stack() -> None:
    found = stacks.samples(gzip.decompress(shared_trace("h100__gaunernst_bert").read_bytes()))
    (frames, step), _ns = max(found.device.items(), key=lambda kv: kv[1])
    assert step is not None  # under a ProfilerStep#N
    names = [f.name for f in frames]
    assert names[:3] == ["<module>", "spawn_main", "_main"]
    spawn = frames[1]
    assert (spawn.file, spawn.line) == ("multiprocessing/spawn.py", 122)
    assert "ProfilerStep*" in names and names.index("ProfilerStep*") < len(names) - 2
    assert any(n.startswith("aten::") for n in names)  # the operator chain below the Python frames


def test_collapsed_stacks_parse_and_sum_to_the_samples() -> None:
    found = stacks.samples(gzip.decompress(shared_trace("h100__gaunernst_bert").read_bytes()))
    for values in (found.cpu, found.device):
        lines = stacks.collapsed(values.items()).splitlines()
        parsed = [line.rpartition(" ") for line in lines]
        assert all(sep == " " and frames for frames, sep, _ in parsed)
        assert sum(int(v) for _, _, v in parsed) == sum(values.values())
        assert len({frames for frames, _, _ in parsed}) == len(lines)


# --- a live with_stack window -------------------------------------------------------------------


def _profiled_training_step(model: Any, batch: Any, opt: Any) -> None:
    model(batch).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpReceiver, Path, Any]]:
    tmp = tmp_path_factory.mktemp("profiles")
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp / "spool", **ONE_WINDOW, OTELPROF_TRACE_DIR=str(tmp / "traces"))
        _train_a_little()
        live_session.stop(session)
        wait_until(lambda: bool(rec.profile_requests), 30)
        yield rec, tmp / "traces", session


def test_a_live_window_becomes_an_otlp_profile_that_sums_to_its_self_times(live: Any) -> None:
    rec, folder, _session = live
    [request] = rec.profile_requests
    assert "/v1development/profiles" in rec.paths
    [kept] = folder.glob(f"*{keep.SUFFIX}")
    cpu, device = _self_times(convert(kept))
    profiles = _profiles(request)
    assert set(profiles) == {"cpu"} and device == 0  # a CPU-only machine: no device profile
    assert _sum(profiles["cpu"]) == cpu > 0
    # torch's ProfilerStep ranges cross the loop's Python frames: key_averages has negative self
    # times there, the samples none (taken from the frames below, the total unchanged)
    ops = convert(kept).ops
    assert any(o.self_cpu_ns < 0 for o in ops) and all(v > 0 for s in profiles["cpu"].samples for v in s.values)
    # the loop's own frames, the operators below them
    stacks_seen = [_frames(request, s) for s in profiles["cpu"].samples]
    ours = [f for f in stacks_seen if "_profiled_training_step" in f]
    assert ours and any("aten::addmm" in f for f in ours)
    resource = {kv.key: kv.value.string_value for kv in request.resource_profiles[0].resource.attributes}
    assert resource["otelprof.run.id"] == "flame"


def test_samples_link_to_their_steps_train_step_spans(live: Any) -> None:
    rec, _folder, _session = live
    [request] = rec.profile_requests
    steps = {(s.trace_id, s.span_id): s for s in rec.spans if s.name == "train.step"}
    links = list(request.dictionary.link_table)[1:]
    assert len(links) == 2  # the two recorded steps
    numbers = set()
    for link in links:
        span = steps[(link.trace_id, link.span_id)]
        numbers.add({kv.key: kv.value.int_value for kv in span.attributes}["otelprof.step.number"])
    assert numbers == {3, 4}
    linked = [s for s in _profiles(request)["cpu"].samples if s.link_index]
    assert linked and all(s.link_index in (1, 2) for s in linked)


def test_pprof_and_collapsed_stacks_lie_beside_the_kept_trace(live: Any) -> None:
    _rec, folder, _session = live
    [kept] = folder.glob(f"*{keep.SUFFIX}")
    stem = kept.name.removesuffix(keep.SUFFIX)
    assert sorted(p.name for p in folder.iterdir()) == sorted([kept.name, stem + ".pprof.gz", stem + ".collapsed.txt"])
    cpu, _device = _self_times(convert(kept))
    lines = (folder / (stem + ".collapsed.txt")).read_text().splitlines()
    assert sum(int(line.rpartition(" ")[2]) for line in lines) == cpu
    assert any("_profiled_training_step" in line and ";aten::" in line for line in lines)
    for p in folder.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600


def test_profiles_export_false_sends_no_profile_and_keeps_the_files(tmp_path: Path) -> None:
    with http_receiver() as rec:
        env = {**ONE_WINDOW, "OTELPROF_TRACE_DIR": str(tmp_path / "traces"), "OTELPROF_PROFILES_EXPORT": "false"}
        session = live_session.start(rec.port, tmp_path / "spool", **env)
        _train_a_little()
        live_session.stop(session)
    assert session.profiles_exporter is None and not rec.profile_requests
    assert "/v1development/profiles" not in rec.paths and rec.spans
    [kept] = (tmp_path / "traces").glob(f"*{keep.SUFFIX}")
    stem = kept.name.removesuffix(keep.SUFFIX)
    ends = sorted(p.name.removeprefix(stem) for p in (tmp_path / "traces").iterdir())
    assert ends == [".collapsed.txt", ".pprof.gz", keep.SUFFIX]


def _train_a_little() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in torch.utils.data.DataLoader(torch.randn(32, 16), batch_size=4):
        _profiled_training_step(model, batch, opt)


def _serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_speedscope_opens_the_pprof_file_and_shows_the_loops_frames(live: Any, tmp_path: Path) -> None:
    """speedscope (npm, pinned in tests/prereqs.py) in Debian's chromium: the pprof file loads,
    and its sandwich view (a table of every function, in the page's text) lists the loop's own
    function and the operators under it."""
    from playwright import sync_api
    from ui.browser import chromium, screenshot_dir

    executable, app = chromium(), prereqs.speedscope()
    _rec, folder, _session = live
    [pprof] = folder.glob("*.pprof.gz")
    (tmp_path / "app").symlink_to(app, target_is_directory=True)
    (tmp_path / "window.pb.gz").write_bytes(pprof.read_bytes())
    server, base = _serve(tmp_path)
    shot = screenshot_dir() / "speedscope-window.png"
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=executable, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                page.goto(f"{base}/app/index.html#profileURL={base}/window.pb.gz", timeout=60_000)
                sandwich = page.get_by_text("Sandwich").first  # "🥪Sandwich"
                sandwich.wait_for(state="visible", timeout=60_000)
                sandwich.click()
                page.get_by_text("_profiled_training_step").first.wait_for(state="visible", timeout=60_000)
                page.screenshot(path=str(shot), full_page=False)
                text = page.inner_text("body")
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert "_profiled_training_step" in text and "aten::addmm" in text
    assert "Total\tSelf\tSymbol Name" in text  # the sandwich table, CPU self time (the default type)
    assert "window.pb.gz" in text  # the file speedscope names in its title bar


def test_a_gpu_window_gets_device_stacks_beside_its_trace(tmp_path: Path) -> None:
    """The conversion thread's step on a real GPU window (the H100 trace as a saved window)."""
    source = tmp_path / "window.json"
    source.write_bytes(gzip.decompress(shared_trace("h100__gaunernst_bert").read_bytes()))
    keeper = keep.TraceKeeper(keep.KeepSettings(directory=tmp_path / "traces"))
    kept = keeper.keep(source, keep.trace_name("gpu", 0, 6, 1_700_000_000_000_000_000))
    assert kept is not None
    sent: list[bytes] = []
    profiles = WindowProfiles(sent.append, keeper)
    profiles.window(source, (), kept, ConvertOptions(), "w")
    assert (profiles.done, profiles.failed) == (1, 0)
    cpu, device = _self_times(convert(source))
    got = _profiles(ExportProfilesServiceRequest.FromString(sent[0]))
    assert (_sum(got["cpu"]), _sum(got["device"])) == (cpu, device)
    names = {p.name.removeprefix(kept.name.removesuffix(keep.SUFFIX)) for p in profiles.files}
    assert names == {".pprof.gz", ".collapsed.txt", ".device.collapsed.txt"}
    [device_file] = [p for p in profiles.files if p.name.endswith(".device.collapsed.txt")]
    lines = device_file.read_text().splitlines()
    assert sum(int(line.rpartition(" ")[2]) for line in lines) == device
    assert all(";aten::" in line or line.startswith(stacks.UNATTRIBUTED) for line in lines)


def test_a_window_over_the_bound_is_skipped_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "window.json"
    source.write_bytes(gzip.decompress(shared_trace("amd_trace__mi250").read_bytes()))
    monkeypatch.setattr(otelprof_profiles, "MAX_TRACE_BYTES", source.stat().st_size - 1)
    sent: list[bytes] = []
    profiles = WindowProfiles(sent.append, None)
    profiles.window(source, (), None, ConvertOptions(), "w")
    assert (profiles.skipped, profiles.done, sent) == (1, 0, [])


# --- the profiles route: gRPC, URLs, the kept folder's bounds ---------------------------------


def test_grpc_sends_profiles_to_the_profiles_service(tmp_path: Path) -> None:
    found = stacks.samples(gzip.decompress(shared_trace("amd_trace__mi250").read_bytes()))
    step = LiveStep(number=1, trace_id=b"t" * 16, span_id=b"s" * 8)
    request = encode.otlp_request(found, {1: step}, [("service.name", "svc")], "1.0", "w")
    with grpc_receiver(GrpcReceiver()) as rec:
        environ = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rec.port}"}
        cfg = profiles_config(exporter_config_from_env(environ), environ)
        exporter = Exporter(cfg, spool_dir=tmp_path / "spool")
        exporter.submit(request)
        assert exporter.flush(30)
        exporter.shutdown()
    assert exporter.counters.requests_exported == 1 and not rec.requests
    [got] = rec.profile_requests
    assert got.SerializeToString() == request
    assert _sum(_profiles(got)["device"]) == found.device_total_ns


def test_without_an_endpoint_profiles_wait_in_a_spool_folder_of_their_own(tmp_path: Path) -> None:
    """Never replayed as traces: ``otelprof spool`` and the traces exporter see the traces' folder."""
    found = stacks.samples(gzip.decompress(shared_trace("amd_trace__mi250").read_bytes()))
    request = encode.otlp_request(found, {}, [], "1.0", "w")
    registry = CollectorRegistry()
    traces = Exporter(exporter_config_from_env({}), spool_dir=tmp_path / "spool", registry=registry)
    exporter = otelprof_profiles.exporter(traces, {})
    exporter.submit(request)
    exporter.shutdown()
    traces.shutdown()
    assert exporter.counters.requests_spooled == 1
    # each signal's series in the one registry: the profile is counted as profiles', not traces'
    spooled = {"signal": "profiles", "result": "spooled"}
    assert registry.get_sample_value("otelprof_export_requests_total", spooled) == 1
    assert registry.get_sample_value("otelprof_export_requests_total", {**spooled, "signal": "traces"}) == 0
    profiles_spool = Spool(tmp_path / "spool" / "profiles").bytes_used()
    assert profiles_spool >= len(request)
    assert registry.get_sample_value("otelprof_export_spool_bytes", {"signal": "profiles"}) == profiles_spool
    assert registry.get_sample_value("otelprof_export_spool_bytes", {"signal": "traces"}) == 0
    [(_record, data)] = list(
        Spool(tmp_path / "spool" / "profiles").read(Spool(tmp_path / "spool" / "profiles").records())
    )
    assert data == request
    assert Spool(tmp_path / "spool").records() == []


@pytest.mark.parametrize(
    ("environ", "url"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318/v1development/profiles"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/otlp/"}, "http://c:4318/otlp/v1development/profiles"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/v1/traces"}, "https://c/v1development/profiles"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/in/spans"}, "https://c/in/v1development/profiles"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT": "http://p:1/x"},
            "http://p:1/x",
        ),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "http://c:4317"),
    ],
)
def test_the_profiles_url_follows_the_traces_endpoint(environ: dict[str, str], url: str) -> None:
    traces = exporter_config_from_env(environ)
    cfg = profiles_config(traces, environ)
    assert (cfg.url, cfg.signal, cfg.protocol, cfg.headers) == (url, "profiles", traces.protocol, traces.headers)


def test_profile_files_go_with_their_trace_and_count_in_the_folders_bytes(tmp_path: Path) -> None:
    source = tmp_path / "window.json"
    source.write_bytes(b'{"traceEvents": []}' + b" " * 4000)
    keeper = keep.TraceKeeper(keep.KeepSettings(count=2, max_bytes=10**9, directory=tmp_path / "traces"))
    kept = []
    for k in range(3):
        path = keeper.keep(source, keep.trace_name("run", 0, k, 1_700_000_000_000_000_000 + k * 10**9))
        assert path is not None
        assert keeper.keep_beside(path, ".pprof.gz", b"p" * 100) == path.with_name(
            keep.companion(path.name, ".pprof.gz")
        )
        kept.append(path)
    left = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert left == sorted(n for p in kept[1:] for n in (p.name, keep.companion(p.name, ".pprof.gz")))
    # the bytes bound counts the companions: three traces fit, not with their pprof files
    one = kept[2].stat().st_size
    keeper = keep.TraceKeeper(keep.KeepSettings(count=9, max_bytes=3 * one + 50, directory=tmp_path / "traces"))
    newest = keeper.keep(source, keep.trace_name("run", 0, 9, 1_800_000_000_000_000_000))
    assert newest is not None
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == sorted(
        [kept[2].name, keep.companion(kept[2].name, ".pprof.gz"), newest.name]
    )
