"""The Collector, Tempo, Grafana, compose and Kubernetes files, checked without their binaries:
the YAML parses, every Collector component exists in the contrib distribution, pipelines use
defined components, and ports, host names and file paths agree across the files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "collector-config"
COLLECTORS = {"gateway": CONFIG / "otelcol" / "gateway.yaml", "agent": CONFIG / "otelcol" / "agent.yaml"}
COLLECTOR_IMAGE = "otel/opentelemetry-collector-contrib:0.136.0"


def _names(text: str) -> set[str]:
    return set(text.split())


#: Component types of otelcol-contrib 0.136.0 (the distribution's manifest), by kind: what a
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
        debug nop otlp otlphttp loadbalancing prometheus prometheusremotewrite kafka file zipkin
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
    return component_id.split("/", 1)[0]  # "otlp/tempo" is an otlp exporter named tempo


def _port(endpoint: str) -> int:
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
    for pipeline_id, pipeline in service["pipelines"].items():
        assert _type(pipeline_id) in ("traces", "metrics", "logs"), pipeline_id
        assert pipeline["receivers"] and pipeline["exporters"], pipeline_id
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in (config.get(kind) or {}), f"{pipeline_id} names undefined {component}"
                used[kind].add(component)
        processors = pipeline.get("processors", [])
        # the memory limiter first, batching last: the Collector's recommended order
        assert processors[0] == "memory_limiter" and processors[-1] == "batch", pipeline_id
    for kind in KINDS:
        assert set(config.get(kind) or {}) == used[kind], f"{kind} defined but unused in {name}"


def test_gateway_keeps_every_step_span_and_samples_operator_detail() -> None:
    config = _yaml(COLLECTORS["gateway"])
    pipelines = config["service"]["pipelines"]
    steps, detail = pipelines["traces/steps"], pipelines["traces/detail"]
    assert "tail_sampling" not in steps["processors"]
    assert detail["processors"].index("tail_sampling") < detail["processors"].index("filter/operator_spans")
    assert steps["exporters"] == detail["exporters"] == ["otlp/tempo", "otlp/jaeger"]
    keep_steps = config["processors"]["filter/step_spans"]["traces"]["span"]
    drop_steps = config["processors"]["filter/operator_spans"]["traces"]["span"]
    # the two filters are complements over the same attributes (their meaning is checked on real
    # spans in test_live_prometheus.py)
    assert keep_steps == ['attributes["otelprof.step.source"] == nil and attributes["otelprof.phase"] == nil']
    assert drop_steps == ['attributes["otelprof.step.source"] != nil or attributes["otelprof.phase"] != nil']
    policies = {p["type"]: p for p in config["processors"]["tail_sampling"]["policies"]}
    assert set(policies) == {"latency", "status_code", "probabilistic"}
    assert int(_env_default(policies["latency"]["latency"]["threshold_ms"])) > 0
    # otelprof's requests (OTELPROF_MAX_REQUEST_BYTES, 3 MiB by default) fit the receivers
    for name in COLLECTORS:
        receivers = _yaml(COLLECTORS[name])["receivers"]["otlp"]["protocols"]
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
    metrics_endpoint = _env_default(agent["exporters"]["otlp/gateway"]["endpoint"])
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
    assert _host_file(collector, config_path) == COLLECTORS["gateway"]
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
    tempo = _yaml(CONFIG / "tempo" / "tempo.yaml")
    tempo_grpc = _port(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    for exporter, variable, backend, port in (
        ("otlp/tempo", "TEMPO_OTLP_ENDPOINT", "tempo", tempo_grpc),
        ("otlp/jaeger", "JAEGER_OTLP_ENDPOINT", "jaeger", 4317),  # Jaeger's OTLP gRPC port
    ):
        endpoint = gateway["exporters"][exporter]["endpoint"]
        assert env[variable] == _env_default(endpoint) == f"{backend}:{port}"
        assert backend in services
    assert set(re.findall(r"\$\{env:(\w+)", COLLECTORS["gateway"].read_text())) <= set(env)

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


def test_kubernetes_prometheus_jobs_match_the_rules() -> None:
    config = _yaml(CONFIG / "kubernetes" / "prometheus.yml")
    assert [j["job_name"] for j in config["scrape_configs"]] == ["otelprof", "otel-collector"]
    for pattern in config["rule_files"]:
        assert list((CONFIG / "kubernetes").glob(pattern)), pattern
    rules = (CONFIG / "prometheus" / "rules" / "otelprof-alerts.yml").read_text()
    assert 'up{job="otelprof"}' in rules and 'up{job="otel-collector"}' in rules
