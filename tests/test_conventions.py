"""The attribute registry (otelprof/otlp/conventions.py) against what otelprof really sends and
against docs/semantic-conventions.md: a name emitted but not registered, a registered name
nothing emits (unless marked rare, with why), a type or place that differs, or a stale doc
section each fail here."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

import pytest
from converter_helpers import KINETO_TRACES, SHARED, convert_cached, reference_skips_default, skip_unless_native
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from otelprof.otlp import conventions as conv
from otelprof.otlp.conventions import BY_NAME, REGISTRY

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "semantic-conventions.md"
NSYS = sorted((SHARED / "nsys").glob("*.sqlite")) if (SHARED / "nsys").is_dir() else []

#: AnyValue field -> the registry types it may carry.
_TYPES = {
    "string_value": {conv.STRING, conv.JSON},
    "int_value": {conv.INT},
    "double_value": {conv.DOUBLE},
    "bool_value": {conv.BOOL},
}
_SPAN_PLACES = {conv.STEP, conv.PHASE, conv.OP, conv.DEVICE, conv.SYNTHETIC, conv.ROOT, conv.AGGREGATE}

Seen = dict[tuple[str, str], str]  # (place, key) -> AnyValue field


def _collect(seen: Seen, requests: Iterable[bytes]) -> None:
    def put(place: str, kvs: Iterable[KeyValue]) -> None:
        for kv in kvs:
            seen[(place, kv.key)] = str(kv.value.WhichOneof("value"))

    for data in requests:
        for rs in ExportTraceServiceRequest.FromString(data).resource_spans:
            put("resource", rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    put("span", span.attributes)
                    for event in span.events:
                        assert event.name == conv.MEMORY_EVENT_NAME
                        put("event", event.attributes)
                    for link in span.links:
                        put("link", link.attributes)


def _converted(seen: Seen) -> None:
    """Both engines on every shared Kineto trace (the reference at full detail where it skips
    default detail on big traces, as the engine equality tests do), one with a kept source file."""
    for path in KINETO_TRACES:
        for detail in ("default", "full"):
            _collect(seen, convert_cached(path, "native", detail=detail).requests)
        ref_detail = "full" if reference_skips_default(path) else "default"
        _collect(seen, convert_cached(path, "reference", detail=ref_detail).requests)
    if KINETO_TRACES:
        _collect(seen, convert_cached(KINETO_TRACES[0], "native", source_file="/kept/trace.json.gz").requests)


def _imported(seen: Seen) -> None:
    from otelprof.converter import ConvertOptions
    from otelprof.importer.nsys import convert_nsys

    for path in NSYS:
        _collect(seen, convert_nsys(path, ConvertOptions(run_id="conventions")).requests)


@cache
def _files_seen() -> Seen:
    skip_unless_native()
    if not KINETO_TRACES:
        pytest.skip(f"no shared traces under {SHARED}")
    seen: Seen = {}
    _converted(seen)
    _imported(seen)
    return seen


def _live_seen(tmp_path: Path) -> Seen:
    """A short real training loop under the instrumentor, one profiling window in it (kept)."""
    torch = pytest.importorskip("torch")
    from capture import live_session
    from export.receivers import http_receiver

    schedule = {
        "OTELPROF_PROFILE_EARLY": "0",
        "OTELPROF_PROFILE_SKIP_FIRST": "1",
        "OTELPROF_PROFILE_WAIT": "0",
        "OTELPROF_PROFILE_WARMUP": "1",
        "OTELPROF_PROFILE_ACTIVE": "2",
        "OTELPROF_PROFILE_REPEAT": "1",
        "OTELPROF_TRIGGER_SIGNAL": "none",
        "OTELPROF_ANOMALY_FACTOR": "0",
    }
    with http_receiver() as rec:
        session = live_session.start(rec.port, tmp_path / "spool", OTELPROF_RUN_ID="conventions", **schedule)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.randint(0, 100, (48, 4)), batch_size=8)  # token ids
        for batch in loader:
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        live_session.stop(session)
        seen: Seen = {}
        _collect(seen, [r.SerializeToString() for r in rec.requests])
    return seen


def _check_registered(seen: Seen) -> list[str]:
    wrong = []
    places = {"resource": {conv.RESOURCE}, "span": _SPAN_PLACES, "event": {conv.MEMORY_EVENT}, "link": {conv.LINK}}
    for (place, key), field in sorted(seen.items()):
        entry = BY_NAME.get(key)
        if entry is None:
            wrong.append(f"{key} ({place}) is emitted but not in the registry")
            continue
        if not places[place] & set(entry.on):
            wrong.append(f"{key} is emitted on a {place}, the registry says {entry.on}")
        if entry.type not in _TYPES[field]:
            wrong.append(f"{key} is emitted as {field}, the registry says {entry.type}")
    return wrong


def test_every_emitted_attribute_is_registered_and_every_entry_emitted(tmp_path: Path) -> None:
    seen = {**_files_seen(), **_live_seen(tmp_path)}
    assert not _check_registered(seen)
    emitted = {key for _place, key in seen}
    never = [a.name for a in REGISTRY if a.name not in emitted and a.rare is None]
    assert not never, f"registered, emitted by none of the inputs, not marked rare: {never}"
    # live-only attributes really came from the live loop (not only from the registry's hopes)
    for key in ("otelprof.step.source", "otelprof.phase.name", "otelprof.step.window", "otelprof.source.file"):
        assert key in emitted


def test_a_name_is_never_both_an_attribute_and_a_namespace() -> None:
    names = [a.name for a in REGISTRY]
    assert len(names) == len(set(names))
    leaves = set(names) | {conv.MEMORY_EVENT_NAME}
    clashes = [(n, o) for n in names for o in leaves if n.startswith(o + ".") and o in names]
    assert not clashes


def test_origins_follow_the_namespaces() -> None:
    for a in REGISTRY:
        assert a.name.startswith("otelprof.") == (a.origin == conv.OTELPROF), a.name
        assert not a.name.startswith(("pytorch.", "hw.")), a.name  # namespaces otelprof does not own


def test_the_schema_tables_name_registered_attributes() -> None:
    from otelprof.otlp import schema

    for _arg, name, kind in schema.ARG_ATTRIBUTES:
        assert (
            BY_NAME[name].type
            == {"int": conv.INT, "double": conv.DOUBLE, "string": conv.STRING, "json": conv.JSON}[kind]
        )
    for _arg, name in schema.MEMORY_ATTRIBUTES:
        assert BY_NAME[name].on == (conv.MEMORY_EVENT,)


def test_the_doc_section_is_the_registry() -> None:
    text = DOC.read_text("utf-8")
    assert "<!-- attribute-registry -->" in text
    assert conv.render_registry(text) == text, "run: python -m otelprof.otlp.conventions --write"


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otelprof.otlp.conventions", *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )


def _table_rows() -> Iterator[str]:
    yield from conv.registry_table().splitlines()[2:]


def test_the_generator_reports_and_rewrites_a_stale_section(tmp_path: Path) -> None:
    stale = tmp_path / "conventions.md"
    stale.write_text("# x\n<!-- attribute-registry -->\n| old |\n<!-- /attribute-registry -->\ntail\n", "utf-8")
    checked = _run(stale)
    assert checked.returncode == 1 and str(stale) in checked.stdout
    assert _run("--write", stale).returncode == 0
    text = stale.read_text("utf-8")
    assert "| old |" not in text and text.endswith("<!-- /attribute-registry -->\ntail\n")
    assert all(row in text for row in _table_rows())
    assert _run(stale).returncode == 0
    assert _run(tmp_path / "missing.md").returncode == 1


def test_metric_counts_carry_annotations_and_only_ratios_are_dimensionless() -> None:
    from otelprof.capture.metrics import otlp_metrics

    units = [(name, unit) for name, unit in otlp_metrics.DIRECT]
    units += [(name, unit) for name, _counter, unit in otlp_metrics.BRIDGED]
    units += list(otlp_metrics.BRIDGED_HISTOGRAMS)
    for name, unit in units:
        if unit == "1":
            assert name.endswith("_ratio"), name
        elif unit.endswith("/s"):  # a rate: the Collector's Prometheus exporter appends _per_second
            assert name.endswith("_per_second") and unit[:-2].startswith("{"), (name, unit)
        else:
            assert unit in ("s", "By") or (unit.startswith("{") and unit.endswith("}")), (name, unit)
    assert dict(otlp_metrics.DIRECT)["otelprof.steps"] == "{step}"
