"""The dashboards and rules against a real Prometheus (Debian's package) scraping a real
otelprof-instrumented CPU training run: two DDP ranks over gloo, each serving /metrics, with
profiling windows on a short schedule and spans going to an OTLP receiver.

Every Prometheus query of both dashboards runs through the HTTP API with the template variables
substituted and must return data, except the panels only a GPU run can fill (listed below with
the reason: their queries must parse and come back empty here). Step-time exemplars must be
queryable and point at the traces the receiver got; the shipped rules must evaluate cleanly.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from export.receivers import HttpReceiver, free_port, http_receiver, wait_until

from otelprof.otlp import ids
from stack import tools

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "collector-config" / "prometheus"
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
RUN_ID = "stack-test"
WORLD = 2
STEPS = 120  # per rank
SCRAPE = "500ms"
#: what Grafana's $__rate_interval would be at this scrape interval, with room for a slow machine
RATE_INTERVAL = "10s"

#: queries (by metric) that only a CUDA run fills: the CPU run must leave them empty
GPU_ONLY = {
    "otelprof_gpu_memory_allocated_bytes": "CUDA memory gauges exist only when CUDA is in use",
    "otelprof_gpu_memory_reserved_bytes": "CUDA memory gauges exist only when CUDA is in use",
    "otelprof_gpu_memory_peak_bytes": "CUDA memory gauges exist only when CUDA is in use",
    "otelprof_gpu_memory_total_bytes": "CUDA memory gauges exist only when CUDA is in use",
    "otelprof_window_op_self_device_seconds": "self device time needs kernels in the window",
    "otelprof_window_kernel_device_seconds": "kernels run only on a GPU",
    "otelprof_window_gpu_busy_ratio": "the busy share needs kernels in the window",
}


@dataclass
class Prometheus:
    url: str
    pid: int

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def error_of(self, expr: str) -> str | None:
        """None when ``expr`` parses and evaluates; else Prometheus' message."""
        try:
            self.api("query", query=expr)
        except urllib.error.HTTPError as exc:
            return str(json.loads(exc.read()).get("error"))
        return None


@dataclass
class Run:
    prometheus: Prometheus
    receiver: HttpReceiver
    start: float
    query_time: float


def _two_free_ports() -> int:
    """A port P with P + 1 free too (otelprof serves local rank r on base port + r).

    Both lie below the kernel's ephemeral range: a port picked there is only a number until the
    ranks bind it, and in the meantime Prometheus, the receiver, gloo or any outgoing connection
    could be handed it by bind(0)/connect.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low - 1)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two consecutive free ports below the ephemeral range")


def _prometheus_config(tmp: Path, metrics_port: int) -> Path:
    """The shipped prometheus.yml with its rules, scraping the two ranks every 500 ms."""
    shipped = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    otelprof_job = next(j for j in shipped["scrape_configs"] if j["job_name"] == "otelprof")
    job = {
        **otelprof_job,
        "scrape_interval": SCRAPE,
        "scrape_timeout": SCRAPE,
        "static_configs": [{"targets": [f"127.0.0.1:{metrics_port + r}" for r in range(WORLD)]}],
    }
    config = {
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": "1s"},
        "storage": shipped["storage"],
        "rule_files": [str(PROM_DIR / f) for f in shipped["rule_files"]],
        "scrape_configs": [job],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, int]]:
    binary = tools.require("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    metrics_port = _two_free_ports()
    port = free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={_prometheus_config(tmp, metrics_port)}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc.pid)
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=1) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_until(ready, 60)
        assert proc.poll() is None and ready(), (tmp / "prometheus.log").read_text()[-3000:]
        yield prom, metrics_port
    finally:
        os.kill(proc.pid, 15)  # by PID: this test's Prometheus only
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, 9)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def run(prometheus: tuple[Prometheus, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    prom, metrics_port = prometheus
    tmp = tmp_path_factory.mktemp("ranks")
    master_port = free_port()
    with http_receiver() as receiver:
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
        env = {
            **base_env,
            "PYTHONPATH": os.pathsep.join([str(REPO), base_env.get("PYTHONPATH", "")]),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(WORLD),
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "TRAIN_STEP_SLEEP_S": "0.02",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(metrics_port),
            "OTEL_SERVICE_NAME": "stack-test",
            "OTELPROF_RUN_ID": RUN_ID,
            "OTELPROF_TRIGGER_SIGNAL": "none",
            "OTELPROF_ANOMALY_FACTOR": "0",
            # a window every 8 steps: windows, their top operators and their spans show up
            "OTELPROF_PROFILE_SKIP_FIRST": "2",
            "OTELPROF_PROFILE_WAIT": "5",
            "OTELPROF_PROFILE_WARMUP": "1",
            "OTELPROF_PROFILE_ACTIVE": "2",
            "OTELPROF_PROFILE_REPEAT": "0",
            # windows count FLOPs: the MFU panels have data (a CPU has no peak of its own)
            "OTELPROF_PROFILE_OPTIONS": "with_flops",
            "OTELPROF_PEAK_FLOPS": "1e12",
            # ranks share their mean step time every 20 steps: the straggler panel has data
            "OTELPROF_STRAGGLER_STEPS": "20",
        }
        start = time.time()
        ranks = [
            subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("ddp_train.py")), str(STEPS)],
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "OTELPROF_SPOOL_DIR": str(tmp / f"spool{r}")},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=(tmp / f"rank{r}.log").open("wb"),  # torch and Kineto talk there
            )
            for r in range(WORLD)
        ]
        try:
            for r, proc in enumerate(ranks):
                assert proc.stdout is not None
                line = proc.stdout.readline()
                assert line.strip() == b"trained", (line, (tmp / f"rank{r}.log").read_text()[-3000:])

            # the last scrape with every step counted
            def final_scrape() -> bool:
                result = prom.api("query", query=f'otelprof_steps_total{{run="{RUN_ID}"}}')["result"]
                return len(result) == WORLD and all(float(s["value"][1]) == STEPS for s in result)

            wait_until(final_scrape, 30)
            assert final_scrape(), (
                prom.api("query", query="otelprof_steps_total")["result"],
                [(t["scrapeUrl"], t["health"], t["lastError"]) for t in prom.api("targets")["activeTargets"]],
                [(tmp / f"rank{r}.log").read_text()[-1500:] for r in range(WORLD)],
            )
            last_step = max(
                float(s["value"][1]) for s in prom.api("query", query="otelprof_last_step_timestamp_seconds")["result"]
            )
            # one scrape after the last step: rates over RATE_INTERVAL still see the training
            query_time = last_step + 1
            # every scrape up to query_time is stored (a scrape ends within its 500 ms timeout):
            # queries at that instant read the same samples however late each one runs
            wait_until(lambda: time.time() > query_time + 2, 10)
            yield Run(prom, receiver, start, query_time=query_time)
        finally:
            for proc in ranks:
                if proc.poll() is None and proc.stdin is not None:
                    proc.stdin.close()  # the rank uninstruments and exits
            for proc in ranks:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, 9)
                    proc.wait()


def _dashboard_targets() -> list[tuple[str, str, dict[str, Any]]]:
    """(dashboard file, panel title, target) for every Prometheus target of every panel."""
    found = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                if target.get("datasource", panel.get("datasource", {})).get("type") == "prometheus":
                    found.append((path.name, panel["title"], target))
    return found


def _substitute(expr: str) -> str:
    values = {"job": "otelprof", "run": RUN_ID, "rank": ".*", "instance": ".*", "__rate_interval": RATE_INTERVAL}
    out = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)
    assert "$" not in out, out
    return out


def _gpu_reason(expr: str) -> str | None:
    return next((why for metric, why in GPU_ONLY.items() if metric in expr), None)


TARGETS = _dashboard_targets()


def test_dashboards_have_queries_to_run() -> None:
    assert len(TARGETS) > 30
    assert {name for name, _, _ in TARGETS} == {"otelprof-training.json", "otelprof-operators.json"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "target", [t for _, _, t in TARGETS], ids=[f"{name}:{title}:{t['refId']}" for name, title, t in TARGETS]
)
def test_every_panel_query_returns_data(run: Run, target: dict[str, Any]) -> None:
    expr = _substitute(target["expr"])
    prom = run.prometheus
    if target.get("instant"):
        result = prom.api("query", query=expr, time=f"{run.query_time:.3f}")["result"]
    else:
        result = prom.api("query_range", query=expr, start=f"{run.start:.3f}", end=f"{run.query_time:.3f}", step="1")[
            "result"
        ]
    reason = _gpu_reason(expr)
    if reason is not None:
        # parsed and evaluated (api() asserts success); a CPU run must leave it empty, else the
        # panel belongs with the others
        assert result == [], f"GPU-only ({reason}) yet filled by a CPU run: {expr}"
        return
    assert result, f"no data for {expr}"
    samples = [s["value"] for s in result if "value" in s] + [v for s in result for v in s.get("values", [])]
    assert any(float(v) == float(v) for _, v in samples), f"only NaN for {expr}"  # NaN != NaN


@pytest.mark.slow
def test_template_variables_list_the_run(run: Run) -> None:
    expected = {
        "job": ["otelprof"],
        "run": [RUN_ID],
        "rank": [str(r) for r in range(WORLD)],
    }
    for path in DASHBOARDS:
        for variable in json.loads(path.read_text())["templating"]["list"]:
            if variable["type"] != "query":
                continue
            match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"])
            assert match, variable["query"]
            selector, label = _substitute(match.group(1)), match.group(2)
            values = run.prometheus.api(
                f"label/{label}/values",
                **{"match[]": selector, "start": f"{run.start:.3f}", "end": f"{run.query_time:.3f}"},
            )
            if label == "instance":
                assert len(values) == WORLD and all(v.startswith("127.0.0.1:") for v in values)
            else:
                assert values == expected[label], (path.name, label, values)


@pytest.mark.slow
def test_step_exemplars_point_at_received_step_traces(run: Run) -> None:
    data = run.prometheus.api(
        "query_exemplars",
        query=f'otelprof_step_duration_seconds_bucket{{job="otelprof", run="{RUN_ID}"}}',
        start=f"{run.start:.3f}",
        end=f"{run.query_time + 5:.3f}",
    )
    exemplars = [e for series in data for e in series["exemplars"]]
    assert exemplars, "no exemplar stored"
    step_traces = {ids.trace_id(f"step|{RUN_ID}|{n}").hex() for n in range(STEPS)}
    trace_ids = {e["labels"]["trace_id"] for e in exemplars}
    assert trace_ids <= step_traces
    ranks = {series["seriesLabels"]["rank"] for series in data}
    assert ranks == {str(r) for r in range(WORLD)}
    # the traces they name exist: the ranks' step spans reached the receiver
    wait_until(lambda: any(s.name == "train.step" for s in run.receiver.spans), 10)
    received = {s.trace_id.hex() for s in run.receiver.spans if s.name == "train.step"}
    assert trace_ids & received


@pytest.mark.slow
def test_shipped_rules_evaluate_on_real_series(run: Run) -> None:
    groups = run.prometheus.api("rules")["groups"]
    assert {g["name"] for g in groups} == {
        "otelprof-thresholds",
        "otelprof-recording",
        "otelprof-training",
        "otelprof-telemetry",
    }
    for group in groups:
        for rule in group["rules"]:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
    # the recording rules produce series from the live ranks
    share = run.prometheus.api("query", query='otelprof:step_phase_share:rate5m{phase="forward"}')["result"]
    assert {s["metric"]["rank"] for s in share} == {str(r) for r in range(WORLD)}
    assert all(0 < float(s["value"][1]) < 1 for s in share)
    p95 = run.prometheus.api("query", query="otelprof:step_duration_seconds:p95_rate5m")["result"]
    assert len(p95) == WORLD and all(float(s["value"][1]) > 0 for s in p95)
    # a healthy run: nothing fires
    firing = [a for a in run.prometheus.api("alerts")["alerts"] if a["state"] == "firing"]
    assert firing == []


@pytest.mark.slow
def test_gateway_filters_split_real_spans_into_steps_and_operator_detail(run: Run) -> None:
    """The attributes the Collector's filter processors test (otelcol/gateway-sampled.yaml) tell the
    step-level spans from the operator detail in what a real run sends."""
    gateway = yaml.safe_load((REPO / "collector-config" / "otelcol" / "gateway-sampled.yaml").read_text())
    (condition,) = gateway["processors"]["filter/step_spans"]["traces"]["span"]
    keys = re.findall(r'attributes\["([\w.]+)"\] == nil', condition)
    assert len(keys) == 2 and " and " in condition

    def step_level(span: Any) -> bool:  # the spans filter/step_spans keeps
        return any(kv.key in keys for kv in span.attributes)

    wait_until(lambda: any(s.name.startswith("ProfilerStep#") for s in run.receiver.spans), 10)
    spans = run.receiver.spans
    step_names = {s.name.split(" ")[0] for s in spans if step_level(s)}  # "forward Model": phase, module
    assert step_names == {"train.step", "data", "forward", "backward", "optimizer"}
    detail = {s.name for s in spans if not step_level(s)}
    assert {"aten::embedding", "aten::linear"} <= detail
    assert any(name.startswith("ProfilerStep#") for name in detail)
    assert not {name.split(" ")[0] for name in detail} & {"train.step", "data", "forward", "backward", "optimizer"}


def _instant(run: Run, panel_title: str, ref: str = "A") -> dict[str, float]:
    """A panel's query at the end of training: legend-free {label values: value}."""
    target = next(t for _, title, t in TARGETS if title == panel_title and t["refId"] == ref)
    result = run.prometheus.api("query", query=_substitute(target["expr"]), time=f"{run.query_time:.3f}")["result"]
    return {",".join(s["metric"].values()): float(s["value"][1]) for s in result}


def _one_instant(run: Run, expr: str) -> dict[str, float]:
    """``expr`` evaluated in one query at one instant (one consistent view of the samples)."""
    result = run.prometheus.api("query", query=expr, time=f"{run.query_time:.3f}")["result"]
    return {",".join(s["metric"].values()): float(s["value"][1]) for s in result}


@pytest.mark.slow
def test_every_scrape_is_a_consistent_snapshot(run: Run) -> None:
    """Counters that move together agree within every scrape of both ranks (a scrape reads them
    as one snapshot): tokens = 16 x samples = 16 x 8 x steps, the step histogram's count =
    steps, throughout the run."""
    prom = run.prometheus
    selector = f'{{run="{RUN_ID}"}}'
    for expr in (
        f"otelprof_tokens_total{selector} - 16 * otelprof_samples_total{selector}",
        f"otelprof_samples_total{selector} - 8 * otelprof_steps_total{selector}",
        f"otelprof_micro_batches_total{selector} - otelprof_steps_total{selector}",
        f"otelprof_step_duration_seconds_count{selector} - otelprof_steps_total{selector}",
    ):
        result = prom.api("query_range", query=expr, start=f"{run.start:.3f}", end=f"{run.query_time:.3f}", step="0.5")[
            "result"
        ]
        assert len(result) == WORLD, expr
        values = {float(v) for series in result for _t, v in series["values"]}
        assert values == {0.0}, expr


@pytest.mark.slow
def test_panels_show_the_runs_numbers(run: Run) -> None:
    """What the panels show, checked against what the run did."""
    samples = _instant(run, "Throughput", "A")
    tokens = _instant(run, "Throughput", "B")
    assert samples.keys() == tokens.keys() == {RUN_ID}
    assert samples[RUN_ID] > 0
    # ratios from one query each (not two rates read at different moments): consistent
    # scrapes make them exact, up to float rounding
    sel = f'run="{RUN_ID}"'
    rate = f"[{RATE_INTERVAL}]"
    per_sample = _one_instant(
        run, f"sum(rate(otelprof_tokens_total{{{sel}}}{rate})) / sum(rate(otelprof_samples_total{{{sel}}}{rate}))"
    )
    assert per_sample == {"": pytest.approx(16)}  # SEQ tokens per sample
    per_step = _one_instant(
        run, f"sum(rate(otelprof_samples_total{{{sel}}}{rate})) / sum(rate(otelprof_steps_total{{{sel}}}{rate}))"
    )
    assert per_step == {"": pytest.approx(8)}  # BATCH samples per step (both ranks)
    assert _instant(run, "Steps per second")[RUN_ID] > 0
    shares = _instant(run, "Share of step time by phase")
    assert set(shares) == {"data", "forward", "backward", "optimizer"}
    assert 0 < sum(shares.values()) <= 1
    ranks = _instant(run, "Mean step time by rank")
    assert set(ranks) == {"0", "1"} and all(0 < v < 5 for v in ranks.values())
    top_ops = _instant(run, "Top operators by self CPU time")
    assert any(op.startswith("aten::") for op in top_ops) and "c10d::allreduce_" in top_ops  # DDP's all-reduce
    assert len(top_ops) <= WORLD * 10 + 1  # each rank's top 10, and "other"
    assert _instant(run, "Windows")[""] >= 2 * WORLD  # a window every 8 steps on each rank
    exported = _instant(run, "Export requests", "A")
    # by result and signal: these ranks record no stacks, so traces are the only signal
    assert {key.split(",")[1] for key in exported} == {"traces"}
    assert exported["exported,traces"] > 0 and exported["dropped,traces"] == 0


@pytest.mark.slow
def test_ranks_expose_the_straggler_ratio(run: Run) -> None:
    """Both ranks' ratios, after their first exchange: each is its mean step time over the
    median of both ranks' means (of two: their mean), so the two average to 1."""
    ratios = _one_instant(run, f'max by (rank) (otelprof_straggler_ratio{{run="{RUN_ID}"}})')
    assert sorted(ratios) == ["0", "1"], ratios
    assert abs(sum(ratios.values()) / WORLD - 1.0) < 1e-6
    assert run.prometheus.api("metadata", metric="otelprof_window_gpu_busy_ratio") == {}  # none on a CPU
