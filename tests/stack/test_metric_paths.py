"""The metrics reach Prometheus under the same names on both paths: scraped from /metrics, and
pushed over OTLP (OTEL_METRICS_EXPORTER=otlp) through the gateway Collector's ``prometheus``
exporter, which renames each metric by the rules of opentelemetry-collector-contrib's
``pkg/translator/prometheus`` (normalize_name.go), applied here rule by rule. One real short
run (metric_paths_run.py) serves both: its own /metrics text, and what a real OTLP receiver got.
Every series a dashboard query names must come out of both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from capture import live_session
from export.receivers import http_receiver
from prometheus_client.parser import text_string_to_metric_families

from otelprof.capture.metrics.otlp_metrics import BRIDGED, otel_name

pytest.importorskip("torch")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
GATEWAY = REPO / "collector-config" / "otelcol" / "gateway.yaml"

#: normalize_name.go's unitMap (main units) and perUnitMap, the entries otelprof can meet
UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "KiBy": "kibibytes", "1": "", "%": "percent"}
PER_UNITS = {"s": "second", "m": "minute", "h": "hour"}
#: the Prometheus series of each OTLP data type (a histogram is three; a sum that is not
#: monotonic becomes a gauge)
SERIES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}

#: dashboard series a single-rank CPU run cannot make (on either path): checked by declaration
NOT_IN_A_CPU_RUN = {
    "otelprof_gpu_memory_allocated_bytes": "CUDA memory",
    "otelprof_gpu_memory_reserved_bytes": "CUDA memory",
    "otelprof_gpu_memory_peak_bytes": "CUDA memory",
    "otelprof_gpu_memory_total_bytes": "CUDA memory",
    "otelprof_window_op_self_device_seconds": "device time of a window",
    "otelprof_window_kernel_device_seconds": "kernels of a window",
    "otelprof_window_gpu_busy_ratio": "kernels of a window",
    "otelprof_straggler_ratio": "ranks to compare",
}
#: otelprof families on /metrics only: over OTLP, rates come from the counters
SCRAPE_ONLY = {"otelprof_samples_per_second", "otelprof_tokens_per_second"}


def prometheus_name(name: str, unit: str, kind: str, namespace: str = "", suffixes: bool = True) -> str:
    """The name the Collector's Prometheus exporter gives an OTLP metric (``kind``: histogram,
    counter (a monotonic sum) or gauge), by normalize_name.go's rules."""
    # 1. the name's tokens: split at every character that is not a letter or digit
    tokens = [t for t in re.split(r"[^A-Za-z0-9]+", name) if t]
    if suffixes:  # add_metric_suffixes (default true) gates rules 2 to 5
        main, _, per = (u.strip() for u in unit.partition("/"))
        # 2. the main unit, mapped (s -> seconds, By -> bytes, 1 -> nothing), appended unless
        #    blank, an annotation ({...}) or a token already
        if main and not re.search(r"[{}]", main):
            word = UNITS.get(main, main)
            if word and word not in tokens:
                tokens.append(word)
        # 3. a per unit: "per" and the unit in the singular (1/s -> per_second), same conditions
        if per and not re.search(r"[{}]", per):
            word = PER_UNITS.get(per, per)
            if word and word not in tokens:
                tokens += ["per", word]
        # 4. a monotonic sum ends in "total" (once)
        if kind == "counter":
            tokens = [t for t in tokens if t != "total"] + ["total"]
        # 5. a gauge of unit "1" ends in "ratio" (once); counters of unit "1" keep no suffix
        if unit == "1" and kind == "gauge":
            tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    # 6. the exporter's namespace first, tokens joined by "_", and "_" before a leading digit
    joined = "_".join(([namespace] if namespace else []) + tokens)
    return "_" + joined if joined[:1].isdigit() else joined


def test_translator_rules_on_known_cases() -> None:
    """The rules on the cases the issue and the translator's own examples name."""
    assert prometheus_name("otelprof.export.queue.requests", "1", "gauge") == "otelprof_export_queue_requests_ratio"
    assert prometheus_name("otelprof.export.queue.requests", "{request}", "gauge") == "otelprof_export_queue_requests"
    assert prometheus_name("otelprof.steps", "1", "counter") == "otelprof_steps_total"
    assert prometheus_name("otelprof.steps", "{step}", "counter") == "otelprof_steps_total"
    assert prometheus_name("system.io", "By", "counter") == "system_io_bytes_total"
    assert prometheus_name("http.server.duration", "s", "histogram") == "http_server_duration_seconds"
    assert prometheus_name("net.rate", "By/s", "gauge") == "net_rate_bytes_per_second"
    assert prometheus_name("cpu.seconds", "s", "counter") == "cpu_seconds_total"  # unit already a token
    assert prometheus_name("busy.ratio", "1", "gauge") == "busy_ratio"
    assert prometheus_name("requests.total", "{request}", "counter") == "requests_total"
    assert prometheus_name("steps", "{step}", "counter", namespace="ns") == "ns_steps_total"
    assert prometheus_name("2xx", "{request}", "gauge") == "_2xx"
    assert prometheus_name("queue", "1", "gauge", suffixes=False) == "queue"


def _gateway_exporter() -> dict[str, Any]:
    """The gateway's prometheus exporter settings (namespace, add_metric_suffixes)."""
    config = yaml.safe_load(GATEWAY.read_text())
    (name,) = [n for n in config["exporters"] if n.split("/")[0] == "prometheus"]
    assert name in config["service"]["pipelines"]["metrics"]["exporters"]
    return config["exporters"][name] or {}


def _dashboard_series() -> dict[str, str]:
    """Every otelprof_* series a dashboard query or template variable names -> where."""
    found: dict[str, str] = {}

    def walk(node: Any, where: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, dict):
            here = f"{where} / {node['title']}" if isinstance(node.get("title"), str) else where
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    yield from ((m, here) for m in re.findall(r"\botelprof_\w+", value))
                else:
                    yield from walk(value, here)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item, where)

    for path in sorted((REPO / "dashboards").glob("*.json")):
        for series, where in walk(json.loads(path.read_text("utf-8")), path.name):
            found.setdefault(series, where)
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, str]]:
    """(series -> type) scraped from the run's /metrics, and (series -> type) its OTLP push
    becomes at the gateway's Prometheus exporter."""
    tmp = tmp_path_factory.mktemp("paths")
    with http_receiver() as rec:
        env = {
            **live_session.both_metric_paths(rec.port),
            "OTELPROF_RUN_ID": "metric-paths",
            # one window of steps 3-4 (the window's series on both paths)
            "OTELPROF_PROFILE_SKIP_FIRST": "2",
            "OTELPROF_PROFILE_WAIT": "0",
            "OTELPROF_PROFILE_WARMUP": "1",
            "OTELPROF_PROFILE_ACTIVE": "2",
            "OTELPROF_PROFILE_REPEAT": "1",
            "OTELPROF_PROFILE_OPTIONS": "with_flops",  # the MFU series (a CPU has no peak of its own)
            "OTELPROF_PEAK_FLOPS": "1e12",
            "OTELPROF_SPOOL_DIR": str(tmp / "spool"),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        script = [sys.executable, str(HERE / "metric_paths_run.py"), str(tmp / "metrics.txt")]
        out = subprocess.run(script, env=env, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr
    scraped = {}
    for family in text_string_to_metric_families((tmp / "metrics.txt").read_text()):
        for sample in family.samples:
            if not sample.name.endswith("_created"):  # prometheus-client's, no Collector series
                scraped[sample.name] = family.type
    exporter = _gateway_exporter()
    namespace, suffixes = exporter.get("namespace", ""), exporter.get("add_metric_suffixes", True)
    pushed: dict[str, str] = {}
    for request in rec.metric_requests:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind, points = _kind(metric)
                    if not points:  # an observable with nothing to observe: no series
                        continue
                    name = prometheus_name(metric.name, metric.unit, kind, namespace, suffixes)
                    for suffix in SERIES[kind]:
                        assert pushed.setdefault(name + suffix, kind) == kind, name
    return scraped, pushed


def _kind(metric: Any) -> tuple[str, int]:
    """(histogram, counter or gauge, the number of points) of an OTLP metric."""
    data = metric.WhichOneof("data")
    if data == "sum":
        return ("counter" if metric.sum.is_monotonic else "gauge"), len(metric.sum.data_points)
    assert data in ("gauge", "histogram"), metric  # otelprof sends no summaries or exponential histograms
    return data, len(getattr(metric, data).data_points)


def test_every_dashboard_series_is_made_by_both_paths(run: tuple[dict[str, str], dict[str, str]]) -> None:
    scraped, pushed = run
    wanted = _dashboard_series()
    assert "otelprof_export_queue_requests" in wanted and "otelprof_export_duration_seconds_bucket" in wanted
    in_run = {s: where for s, where in wanted.items() if _family(s) not in NOT_IN_A_CPU_RUN}
    missing_scrape = {s: w for s, w in in_run.items() if s not in scraped}
    missing_push = {s: w for s, w in in_run.items() if s not in pushed}
    assert not missing_scrape, f"dashboard series not on /metrics: {missing_scrape}"
    assert not missing_push, f"dashboard series not made from the OTLP push: {missing_push}"
    # the rest: absent from this run on both paths (else they belong above), and declared for
    # OTLP under a unit and type the exporter turns back into the scrape name
    exporter = _gateway_exporter()
    kinds = {family: "counter" if counter else "gauge" for family, counter, _ in BRIDGED}
    for series in set(wanted) - set(in_run):
        family = _family(series)
        assert series not in scraped and series not in pushed, f"{series} is in a CPU run now"
        name, unit = otel_name(family)
        kind = kinds[family]
        assert prometheus_name(name, unit, kind, exporter.get("namespace", "")) == series, series


def test_pushed_names_are_the_scraped_names(run: tuple[dict[str, str], dict[str, str]]) -> None:
    """Every series the push makes is a scraped series of the same type, and every otelprof
    family on /metrics is pushed (but the per-second gauges)."""
    scraped, pushed = run
    assert {"otelprof_steps_total", "otelprof_window_op_self_cpu_seconds", "otelprof_export_spool_bytes"} <= set(pushed)
    for series, kind in pushed.items():
        assert scraped.get(series) == kind, f"{series} ({kind}) pushed, scraped as {scraped.get(series)}"
    ours = {s for s in scraped if s.startswith("otelprof_") and _family(s) not in SCRAPE_ONLY}
    assert ours - set(pushed) == set()


def _family(series: str) -> str:
    """The family of a dashboard series name (histogram and counter suffixes off)."""
    return re.sub(r"_(bucket|sum|count|total)$", "", series)
