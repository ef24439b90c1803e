"""The Collector, Tempo, Grafana, compose and Kubernetes files, checked without their binaries:
the YAML parses, every Collector component exists in the contrib distribution, pipelines use
defined components, and ports, host names and file paths agree across the files; and the
gateways' trace rules (filter and routing conditions, sampling policies, read from the YAML)
applied to what otelprof really sends: what each backend exporter would receive."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from converter_helpers import shared_trace
from export.receivers import http_receiver
from importer.helpers import NSYS, import_env, run_import, shared, value
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Status

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "collector-config"
OTELCOL = CONFIG / "otelcol"
COLLECTORS = {
    "gateway": OTELCOL / "gateway.yaml",
    "gateway-sampled": OTELCOL / "gateway-sampled.yaml",
    "agent": OTELCOL / "agent.yaml",
}
BACKENDS = ["otlp_grpc/tempo", "otlp_grpc/jaeger"]
COLLECTOR_IMAGE = "otel/opentelemetry-collector-contrib:0.144.0"


def _names(text: str) -> set[str]:
    return set(text.split())


#: Component types of otelcol-contrib 0.144.0 (the distribution's manifest), by kind: what a
#: configuration may name. Not exhaustive for receivers (about 90, most for other systems).
CONTRIB = {
    "receivers": _names(
        """
        otlp nop prometheus prometheus_simple prometheusremotewrite jaeger zipkin kafka filelog
        hostmetrics kubeletstats k8s_cluster k8s_events k8sobjects otlpjsonfile receiver_creator statsd
        docker_stats httpcheck otelarrow journald syslog
        """
    ),
    "processors": _names(
        """
        batch memory_limiter attributes cumulativetodelta deltatocumulative deltatorate filter geoip
        groupbyattrs groupbytrace interval k8sattributes logdedup metricsgeneration metricstransform
        probabilistic_sampler redaction remotetap resourcedetection resource schema span tail_sampling
        transform metricstarttime isolationforest sumologic coralogix
        """
    ),
    "exporters": _names(
        """
        debug nop otlp_grpc otlp_http loadbalancing prometheus prometheusremotewrite kafka file zipkin
        elasticsearch clickhouse awsxray awsemf awss3 googlecloud datadog otelarrow splunk_hec syslog
        opensearch influxdb carbon sapm signalfx
        """
    ),
    "extensions": _names(
        """
        health_check pprof zpages file_storage basicauth bearertokenauth oauth2client oidc
        headers_setter sigv4auth jaegerremotesampling k8s_observer docker_observer host_observer opamp
        http_forwarder
        """
    ),
    "connectors": _names(
        """
        forward count exceptions failover roundrobin routing servicegraph spanmetrics sum
        signaltometrics
        """
    ),
}
KINDS = tuple(CONTRIB)


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text("utf-8"))


def _type(component_id: str) -> str:
    return component_id.split("/", 1)[0]  # "otlp_grpc/tempo" is an otlp_grpc exporter named tempo


def _port(endpoint: str) -> int:
    if str(endpoint).startswith("${env:"):
        endpoint = _env_default(endpoint)  # the port stays that of the default (compose sets the host only)
    return int(endpoint.rsplit(":", 1)[1])


def _env_default(value: str) -> str:
    """``${env:NAME:-default}`` -> ``default`` (the value compose and kustomize override)."""
    match = re.fullmatch(r"\$\{env:(\w+):-([^}]*)\}", str(value))
    assert match, f"{value!r}: environment references in these configs carry a default"
    return match.group(2)


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = _yaml(CONFIG / "compose.yaml")
    return compose


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path (relative to collector-config) or volume name."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        out[target] = source
    return out


def _host_file(service: dict[str, Any], container_path: str) -> Path:
    """The repository file a container path of a compose service is mounted from."""
    for target, source in sorted(_mounts(service).items(), key=lambda kv: -len(kv[0])):
        if container_path.startswith(target.rstrip("/") + "/") and source.startswith("."):
            return (CONFIG / source / container_path[len(target) :].lstrip("/")).resolve()
    raise AssertionError(f"{container_path} is not mounted from the repository")


def _flag(service: dict[str, Any], name: str) -> str:
    for arg in service["command"]:
        if arg.startswith(f"{name}="):
            return str(arg.split("=", 1)[1])
    raise AssertionError(f"{name} not in {service['command']}")


def test_every_yaml_file_parses() -> None:
    files = sorted({*CONFIG.rglob("*.yaml"), *CONFIG.rglob("*.yml")})
    assert len(files) >= 15
    for path in files:
        assert list(yaml.safe_load_all(path.read_text("utf-8"))), path


@pytest.mark.parametrize("name", COLLECTORS)
def test_collector_components_exist_and_pipelines_use_defined_ones(name: str) -> None:
    config = _yaml(COLLECTORS[name])
    for kind in KINDS:
        for component in config.get(kind) or {}:
            assert _type(component) in CONTRIB[kind], f"{kind[:-1]} {component!r} is not in otelcol-contrib"
    service = config["service"]
    assert set(service["extensions"]) <= set(config["extensions"])
    used: dict[str, set[str]] = {kind: set() for kind in KINDS}
    used["extensions"] = set(service["extensions"])
    connectors = config.get("connectors") or {}
    connector_ends: dict[str, set[str]] = {c: set() for c in connectors}
    for pipeline_id, pipeline in service["pipelines"].items():
        assert _type(pipeline_id) in ("traces", "metrics", "logs"), pipeline_id
        assert pipeline["receivers"] and pipeline["exporters"], pipeline_id
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                if kind != "processors" and component in connectors:  # a connector: exporter, then receiver
                    used["connectors"].add(component)
                    connector_ends[component].add(kind)
                    continue
                assert component in (config.get(kind) or {}), f"{pipeline_id} names undefined {component}"
                used[kind].add(component)
        processors = pipeline.get("processors", [])
        # the memory limiter first where data enters, batching last before a backend: the
        # Collector's recommended order
        if set(pipeline["receivers"]) - set(connectors):
            assert processors[0] == "memory_limiter", pipeline_id
        if set(pipeline["exporters"]) - set(connectors):
            assert processors[-1] == "batch", pipeline_id
    assert all(ends == {"receivers", "exporters"} for ends in connector_ends.values()), connector_ends
    for kind in KINDS:
        assert set(config.get(kind) or {}) == used[kind], f"{kind} defined but unused in {name}"


def test_receivers_take_otelprofs_largest_requests() -> None:
    # otelprof's requests (OTELPROF_MAX_REQUEST_BYTES, 3 MiB by default) fit the receivers
    for path in COLLECTORS.values():
        receivers = _yaml(path)["receivers"]["otlp"]["protocols"]
        assert receivers["grpc"]["max_recv_msg_size_mib"] * 2**20 >= 3 * 2**20
        assert receivers["http"]["max_request_body_size"] >= 3 * 2**20


def test_agent_load_balances_by_trace_id_onto_the_gateways_headless_service() -> None:
    agent = _yaml(COLLECTORS["agent"])
    lb = agent["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    hostname = _env_default(lb["resolver"]["dns"]["hostname"])
    port = lb["resolver"]["dns"]["port"]
    gateway = _yaml(COLLECTORS["gateway"])
    assert _port(gateway["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]) == port
    manifests = list(yaml.safe_load_all((CONFIG / "kubernetes" / "gateway.yaml").read_text()))
    services = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Service"}
    namespace = _yaml(CONFIG / "kustomization.yaml")["namespace"]
    headless = services["otelcol-gateway-headless"]
    assert hostname == f"otelcol-gateway-headless.{namespace}.svc.cluster.local"
    assert headless["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in headless["spec"]["ports"]] == [port]
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["selector"].items() <= pod_labels.items()  # it selects the gateway pods
    metrics_endpoint = _env_default(agent["exporters"]["otlp_grpc/gateway"]["endpoint"])
    assert metrics_endpoint == f"otelcol-gateway.{namespace}.svc.cluster.local:4317"
    assert 4317 in [p["port"] for p in services["otelcol-gateway"]["spec"]["ports"]]


def test_kubernetes_manifests_use_the_generated_configs() -> None:
    kustomization = _yaml(CONFIG / "kustomization.yaml")
    for resource in kustomization["resources"]:
        assert (CONFIG / resource).is_file(), resource
    generated = {g["name"]: [CONFIG / f for f in g["files"]] for g in kustomization["configMapGenerator"]}
    for files in generated.values():
        assert all(f.is_file() for f in files)
    for manifest_file, config_file in (("agent.yaml", "agent.yaml"), ("gateway.yaml", "gateway.yaml")):
        workload = next(
            m
            for m in yaml.safe_load_all((CONFIG / "kubernetes" / manifest_file).read_text())
            if m["kind"] in ("DaemonSet", "Deployment")
        )
        spec = workload["spec"]["template"]["spec"]
        container = spec["containers"][0]
        assert container["image"] == COLLECTOR_IMAGE
        volume = spec["volumes"][0]
        files = generated[volume["configMap"]["name"]]
        mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
        assert container["args"] == [f"--config={mount['mountPath']}/{config_file}"]
        assert [f.name for f in files] == [config_file]
        env = {e["name"] for e in container.get("env", [])}
        config_text = files[0].read_text()
        assert set(re.findall(r"\$\{env:(\w+)", config_text)) <= env, f"{manifest_file} leaves a variable unset"
        health = _port(_yaml(files[0])["extensions"]["health_check"]["endpoint"])
        assert container["readinessProbe"]["httpGet"]["port"] == health
    namespace = next(yaml.safe_load_all((CONFIG / "kubernetes" / "namespace.yaml").read_text()))
    assert namespace["metadata"]["name"] == kustomization["namespace"]


def test_compose_services_find_their_files() -> None:
    services = _compose()["services"]
    collector = services["otel-collector"]
    assert collector["image"] == COLLECTOR_IMAGE
    config_path = collector["command"][0].split("=", 1)[1]
    # OTELCOL_CONFIG picks the config (compose's ${VAR:-default}): the default keeps everything
    match = re.fullmatch(r"(.*/)\$\{OTELCOL_CONFIG:-([\w.-]+)\}", config_path)
    assert match, config_path
    assert _host_file(collector, match.group(1) + match.group(2)) == COLLECTORS["gateway"]
    assert _host_file(collector, match.group(1) + "gateway-sampled.yaml") == COLLECTORS["gateway-sampled"]
    tempo = services["tempo"]
    assert _host_file(tempo, _flag(tempo, "-config.file")) == CONFIG / "tempo" / "tempo.yaml"
    prometheus = services["prometheus"]
    prom_config = _host_file(prometheus, _flag(prometheus, "--config.file"))
    assert prom_config == CONFIG / "prometheus" / "prometheus.yml"
    assert "--enable-feature=exemplar-storage" in prometheus["command"]
    for pattern in _yaml(prom_config)["rule_files"]:
        assert list(prom_config.parent.glob(pattern)), pattern
    alertmanager = services["alertmanager"]
    am_config = _host_file(alertmanager, _flag(alertmanager, "--config.file"))
    assert am_config == CONFIG / "alertmanager" / "alertmanager.yml"
    grafana = services["grafana"]
    assert _host_file(grafana, "/etc/grafana/provisioning/datasources/datasources.yaml").is_file()
    provider = _yaml(CONFIG / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml")["providers"][0]
    dashboards = _host_file(grafana, provider["options"]["path"] + "/x").parent
    assert dashboards == REPO / "dashboards"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_file(grafana, home).is_file()
    # Tempo's data lives in its named volume
    tempo_config = _yaml(CONFIG / "tempo" / "tempo.yaml")
    data_mount = next(t for t, s in _mounts(tempo).items() if not s.startswith("."))
    for path in (tempo_config["storage"]["trace"]["wal"]["path"], tempo_config["storage"]["trace"]["local"]["path"]):
        assert path.startswith(data_mount + "/")
    assert set(_compose()["volumes"]) == {
        s for svc in services.values() for s in _mounts(svc).values() if not s.startswith(".")
    }


def test_ports_and_hosts_agree_across_compose_and_configs() -> None:
    services = _compose()["services"]

    def published(service: str) -> set[int]:
        return {int(str(p).split(":")[-1]) for p in services[service].get("ports", [])}

    gateway = _yaml(COLLECTORS["gateway"])
    otlp = gateway["receivers"]["otlp"]["protocols"]
    assert {_port(otlp["grpc"]["endpoint"]), _port(otlp["http"]["endpoint"])} <= published("otel-collector")
    assert _port(gateway["extensions"]["health_check"]["endpoint"]) in published("otel-collector")
    env = services["otel-collector"]["environment"]
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", services["jaeger"]["image"])  # Jaeger v2
    assert "environment" not in services["jaeger"]  # v1's COLLECTOR_OTLP_ENABLED & co. mean nothing to v2
    tempo = _yaml(CONFIG / "tempo" / "tempo.yaml")
    tempo_grpc = _port(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    for exporter, variable, backend, port in (
        ("otlp_grpc/tempo", "TEMPO_OTLP_ENDPOINT", "tempo", tempo_grpc),
        ("otlp_grpc/jaeger", "JAEGER_OTLP_ENDPOINT", "jaeger", 4317),  # Jaeger v2's OTLP gRPC port (as v1's)
    ):
        endpoint = gateway["exporters"][exporter]["endpoint"]
        assert env[variable] == _env_default(endpoint) == f"{backend}:{port}"
        assert backend in services
    for config in ("gateway", "gateway-sampled"):  # OTELCOL_CONFIG picks either
        assert set(re.findall(r"\$\{env:(\w+)", COLLECTORS[config].read_text())) <= set(env), config

    prom = _yaml(CONFIG / "prometheus" / "prometheus.yml")
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in prom["scrape_configs"]}
    telemetry = gateway["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    assert jobs["otel-collector"] == [f"otel-collector:{telemetry['port']}"]
    assert jobs["otlp-metrics"] == [f"otel-collector:{_port(gateway['exporters']['prometheus']['endpoint'])}"]
    assert jobs["otelprof"] == ["host.docker.internal:9464"]  # OTEL_EXPORTER_PROMETHEUS_PORT's default
    assert "host.docker.internal:host-gateway" in services["prometheus"]["extra_hosts"]
    alertmanagers = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert alertmanagers == ["alertmanager:9093"] and 9093 in published("alertmanager")

    urls = {
        ds["uid"]: ds["url"]
        for ds in _yaml(CONFIG / "grafana" / "provisioning" / "datasources" / "datasources.yaml")["datasources"]
    }
    assert urls == {
        "prometheus": "http://prometheus:9090",
        "tempo": f"http://tempo:{tempo['server']['http_listen_port']}",
        "jaeger": "http://jaeger:16686",
        "alertmanager": "http://alertmanager:9093",
    }
    for uid, url in urls.items():
        host, port = url.removeprefix("http://").split(":")
        assert host in services, uid
        assert int(port) in published(host), f"{uid}: {port} not published by {host}"
    assert published("grafana") == {3000}


def _listeners(config: dict[str, Any]) -> list[str]:
    """Every address a Collector config listens on, as written."""
    otlp = config["receivers"]["otlp"]["protocols"]
    telemetry = config["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    out = [otlp["grpc"]["endpoint"], otlp["http"]["endpoint"], config["extensions"]["health_check"]["endpoint"]]
    if "prometheus" in config.get("exporters", {}):
        out.append(config["exporters"]["prometheus"]["endpoint"])
    return [*out, telemetry["host"]]


def _container_env(manifest: str) -> dict[str, str]:
    workload = next(
        m
        for m in yaml.safe_load_all((CONFIG / "kubernetes" / manifest).read_text())
        if m["kind"] in ("DaemonSet", "Deployment")
    )
    return {e["name"]: e["value"] for e in workload["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("name", COLLECTORS)
def test_listeners_come_from_the_environment_and_default_to_loopback(name: str) -> None:
    """Run by hand, a config listens on loopback only; compose and Kubernetes, which need every
    interface, set the same variables to 0.0.0.0 on the same ports."""
    compose = {str(k): str(v) for k, v in _compose()["services"]["otel-collector"]["environment"].items()}
    environments = {"agent": [_container_env("agent.yaml")]}.get(name, [compose, _container_env("gateway.yaml")])
    for raw in _listeners(_yaml(COLLECTORS[name])):
        match = re.fullmatch(r"\$\{env:(OTELCOL_\w+):-([^}]*)\}", str(raw))
        assert match, f"{name}: {raw!r} is not an OTELCOL_* variable with a default"
        variable, default = match.groups()
        assert default.split(":")[0] == "127.0.0.1", raw
        for env in environments:
            assert env[variable] == default.replace("127.0.0.1", "0.0.0.0"), (name, variable)


def test_kubernetes_prometheus_jobs_match_the_rules() -> None:
    config = _yaml(CONFIG / "kubernetes" / "prometheus.yml")
    assert [j["job_name"] for j in config["scrape_configs"]] == ["otelprof", "otel-collector"]
    for pattern in config["rule_files"]:
        assert list((CONFIG / "kubernetes").glob(pattern)), pattern
    rules = (CONFIG / "prometheus" / "rules" / "otelprof-alerts.yml").read_text()
    assert 'up{job="otelprof"}' in rules and 'up{job="otel-collector"}' in rules


# --- the trace rules applied to otelprof's own output -------------------------------------------
# The filter and routing conditions are read from the configs and evaluated here by a small OTTL
# subset (paths, == / != against nil or strings, and/or/not, parentheses): anything else fails.

_TOKEN = re.compile(
    r'\s*(?:(resource\.attributes|attributes)\["([^"]+)"\]|(==|!=)|(\(|\))|(and|or|not)\b|(nil)\b|"([^"]*)")'
)


@dataclass(frozen=True)
class Sp:
    """A span as the Collector sees it: its attributes and its resource's."""

    key: tuple[bytes, bytes, str]  # (trace id, span id, source): unique over both captures
    name: str
    attrs: dict[str, object]
    resource: dict[str, object]
    start: int
    end: int
    error: bool


def _ottl(condition: str, context: str) -> Callable[[Sp], bool]:
    """``condition`` as a predicate; ``context``: "span" (filter processor) or "resource"."""
    tokens: list[tuple[str, ...]] = []
    pos = 0
    while pos < len(condition.rstrip()):
        match = _TOKEN.match(condition, pos)
        assert match, f"unsupported OTTL at {condition[pos:]!r}"
        tokens.append(match.groups(default=""))
        pos = match.end()

    def peek(*words: str) -> bool:
        return bool(tokens) and any(words_ in tokens[0] for words_ in words)

    def operand() -> Callable[[Sp], object]:
        path, key, _op, _paren, _word, nil, string = tokens.pop(0)
        if path:
            own = path == "attributes" and context == "span"
            return lambda sp: (sp.attrs if own else sp.resource).get(key)
        assert nil or string, f"unsupported operand in {condition!r}"
        return lambda sp: None if nil else string

    def factor() -> Callable[[Sp], bool]:
        if peek("not"):
            tokens.pop(0)
            inner = factor()
            return lambda sp: not inner(sp)
        if peek("("):
            tokens.pop(0)
            inner = disjunction()
            assert tokens.pop(0)[3] == ")", condition
            return inner
        left = operand()
        op = tokens.pop(0)[2]
        right = operand()
        assert op in ("==", "!="), condition
        return (lambda sp: left(sp) == right(sp)) if op == "==" else (lambda sp: left(sp) != right(sp))

    def chain(word: str, part: Callable[[], Callable[[Sp], bool]]) -> Callable[[Sp], bool]:
        parts = [part()]
        while peek(word):
            tokens.pop(0)
            parts.append(part())
        return (lambda sp: any(p(sp) for p in parts)) if word == "or" else (lambda sp: all(p(sp) for p in parts))

    def conjunction() -> Callable[[Sp], bool]:
        return chain("and", factor)

    def disjunction() -> Callable[[Sp], bool]:
        return chain("or", conjunction)

    predicate = disjunction()
    assert not tokens, f"trailing tokens in {condition!r}"
    return predicate


#: tail_sampling's decisions: "none" keeps no trace (the worst case, whatever the policies
#: say), "policies" applies them with the probabilistic baseline not drawn, "all" keeps every trace
DRAWS = ("none", "policies", "all")


def _tail_sample(config: dict[str, Any], spans: list[Sp], draw: str) -> list[Sp]:
    """tail_sampling's decision per trace."""
    if draw != "policies":
        return spans if draw == "all" else []
    traces: dict[bytes, list[Sp]] = {}
    for sp in spans:
        traces.setdefault(sp.key[0], []).append(sp)
    kept: set[bytes] = set()
    for trace_id, members in traces.items():
        for policy in config["policies"]:
            kind = policy["type"]
            if kind == "latency":  # the trace's extent: earliest start to latest end
                extent = max(s.end for s in members) - min(s.start for s in members)
                hit = extent >= int(_env_default(policy["latency"]["threshold_ms"])) * 1_000_000
            elif kind == "status_code":
                assert policy["status_code"]["status_codes"] == ["ERROR"], policy
                hit = any(s.error for s in members)
            elif kind == "probabilistic":
                assert 0 < policy["probabilistic"]["sampling_percentage"] < 100, policy
                hit = False  # not drawn
            else:
                raise AssertionError(f"policy type {kind} is not modelled here")
            if hit:
                kept.add(trace_id)
    return [sp for sp in spans if sp.key[0] in kept]


def _deliver(config: dict[str, Any], spans: list[Sp], draw: str) -> dict[str, Counter[tuple[bytes, bytes, str]]]:
    """What each exporter of ``config`` receives when the otlp receiver gets ``spans``."""
    processors, connectors = config["processors"], config.get("connectors") or {}
    pipelines = {k: v for k, v in config["service"]["pipelines"].items() if _type(k) == "traces"}
    out: dict[str, Counter[tuple[bytes, bytes, str]]] = {}

    def run(pipeline_id: str, batch: list[Sp]) -> None:
        pipeline = pipelines[pipeline_id]
        for processor in pipeline.get("processors", []):
            if _type(processor) == "filter":
                settings = processors[processor]
                assert set(settings["traces"]) == {"span"}, processor
                drops = [_ottl(c, "span") for c in settings["traces"]["span"]]
                batch = [sp for sp in batch if not any(drop(sp) for drop in drops)]
            elif _type(processor) == "tail_sampling":
                batch = _tail_sample(processors[processor], batch, draw)
            else:
                assert _type(processor) in ("memory_limiter", "batch"), f"{processor} is not modelled here"
        for exporter in pipeline["exporters"]:
            if exporter in connectors:
                route(connectors[exporter], batch)
            else:
                out.setdefault(exporter, Counter()).update(sp.key for sp in batch)

    def route(routing: dict[str, Any], batch: list[Sp]) -> None:
        table = [(_ottl(r["condition"], r["context"]), r["pipelines"]) for r in routing["table"]]
        assert all(r["context"] in ("resource", "span") for r in routing["table"])
        targets: dict[str, list[Sp]] = {}
        for sp in batch:  # the first matching route, else the defaults
            chosen = next((p for match, p in table if match(sp)), routing["default_pipelines"])
            for pipeline_id in chosen:
                targets.setdefault(pipeline_id, []).append(sp)
        for pipeline_id, routed in targets.items():
            run(pipeline_id, routed)

    for pipeline_id, pipeline in pipelines.items():
        if "otlp" in pipeline["receivers"]:
            run(pipeline_id, spans)
    return out


def _spans(requests: Iterable[ExportTraceServiceRequest], source: str) -> list[Sp]:
    out = []
    for request in requests:
        for rs in request.resource_spans:
            resource = {kv.key: value([kv], kv.key) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        Sp(
                            (s.trace_id, s.span_id, source),
                            s.name,
                            {kv.key: value([kv], kv.key) for kv in s.attributes},
                            resource,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            s.status.code == Status.STATUS_CODE_ERROR,
                        )
                    )
    return out


NSYS_SAXPY = "saxpy-mpi-cuda"
STEP_SPANS = {"train.step", "data", "forward", "backward", "optimizer"}  # a phase: "forward Model"


@dataclass(frozen=True)
class Captured:
    imported: list[Sp]  # `otelprof import` of a shared Nsight Systems export
    kineto: list[Sp]  # `otelprof import` of a shared Kineto trace
    steps: list[Sp]  # live step and phase spans
    window: list[Sp]  # a live profiling window's operator spans

    @property
    def all(self) -> list[Sp]:
        return [*self.imported, *self.kineto, *self.steps, *self.window]


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """What otelprof sends: an import of the AlexNet trace, and a real 10-step training run
    profiling steps 5 and 6 (torch.profiler's schedule), decoded from a real OTLP receiver."""
    torch = pytest.importorskip("torch")
    from capture import live_session

    tmp = tmp_path_factory.mktemp("captured")
    imports = {}
    for kind, path in (("nsys", shared(NSYS_SAXPY, NSYS)), ("kineto", shared_trace("alexnet"))):
        with http_receiver() as rec, import_env(tmp, rec.port):
            assert run_import(path, "--ledger", tmp / f"{kind}.json") == 0
            imports[kind] = _spans(rec.requests, kind)
    schedule = {"OTELPROF_PROFILE_SKIP_FIRST": "2", "OTELPROF_PROFILE_WAIT": "2", "OTELPROF_PROFILE_WARMUP": "1"}
    quiet = {"OTELPROF_TRIGGER_SIGNAL": "none", "OTELPROF_ANOMALY_FACTOR": "0", "OTELPROF_PROFILE_EARLY": "0"}
    with http_receiver() as rec:
        env = {**schedule, **quiet, "OTELPROF_PROFILE_ACTIVE": "2", "OTELPROF_PROFILE_REPEAT": "1"}
        session = live_session.start(rec.port, tmp / "spool", OTELPROF_RUN_ID="gateway", **env)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in torch.utils.data.DataLoader(torch.randn(40, 16), batch_size=4):
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        live_session.stop(session)
        live = _spans(rec.requests, "live")
    steps = [sp for sp in live if sp.name.split(" ")[0] in STEP_SPANS]
    window = [sp for sp in live if sp.name.split(" ")[0] not in STEP_SPANS]
    yield Captured(imports["nsys"], imports["kineto"], steps, window)


def test_captured_output_has_every_kind(captured: Captured) -> None:
    assert len(captured.kineto) == 523  # the import CLI's own count for this trace
    assert len(captured.imported) > 0 and len({sp.key for sp in captured.all}) == len(captured.all)
    assert Counter(sp.name for sp in captured.steps)["train.step"] == 10
    assert len(captured.steps) == 50  # each step with its four phases
    assert {sp.name for sp in captured.window} >= {"ProfilerStep#5", "ProfilerStep#6", "aten::addmm"}
    # an import says so in its resource; live processes' resources do not
    assert all(str(sp.resource.get("otelprof.source.format")).startswith("nsys") for sp in captured.imported)
    assert not any("otelprof.source.format" in sp.resource for sp in [*captured.steps, *captured.window])


@pytest.mark.parametrize("draw", DRAWS)
def test_default_gateway_delivers_every_span_once(captured: Captured, draw: str) -> None:
    config = _yaml(COLLECTORS["gateway"])
    assert "tail_sampling" not in config["processors"] and "filter" not in {_type(p) for p in config["processors"]}
    delivered = _deliver(config, captured.all, draw)
    every = Counter(sp.key for sp in captured.all)
    assert delivered == {exporter: every for exporter in BACKENDS}


def _without_kineto(delivered: dict[str, Counter[tuple[bytes, bytes, str]]]) -> dict[str, Counter[Any]]:
    return {
        exporter: Counter({k: n for k, n in got.items() if k[2] != "kineto"}) for exporter, got in delivered.items()
    }


def test_sampled_gateway_keeps_imports_and_steps_and_samples_windows(captured: Captured) -> None:
    config = _yaml(COLLECTORS["gateway-sampled"])
    kept = Counter(sp.key for sp in [*captured.imported, *captured.steps])
    # whatever tail sampling decides, the import and every step span arrive, once
    assert _without_kineto(_deliver(config, captured.all, "none")) == {e: kept for e in BACKENDS}
    # the policies: a fast CPU step with no error keeps no operator detail (baseline not drawn)
    assert _without_kineto(_deliver(config, captured.all, "policies")) == {e: kept for e in BACKENDS}
    # every trace drawn: every span arrives exactly once (traces/steps and traces/detail do not
    # both send the step spans)
    every = Counter(sp.key for sp in captured.all)
    assert _deliver(config, captured.all, "all") == {exporter: every for exporter in BACKENDS}
    # a window's trace is kept whole by the latency policy when its step counts as slow
    tail = config["processors"]["tail_sampling"]
    tail["policies"] = [
        {**p, "latency": {"threshold_ms": "${env:X:-0}"}} if p["type"] == "latency" else p for p in tail["policies"]
    ]
    assert _deliver(config, captured.all, "policies") == {exporter: every for exporter in BACKENDS}


def test_sampled_gateway_keeps_kineto_imports_whole(captured: Captured) -> None:
    delivered = _deliver(_yaml(COLLECTORS["gateway-sampled"]), captured.kineto, "none")
    assert delivered == {exporter: Counter(sp.key for sp in captured.kineto) for exporter in BACKENDS}
