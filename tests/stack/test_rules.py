"""The shipped Prometheus and Alertmanager configuration, checked by the tools themselves
(promtool, amtool from Debian's packages), and the rules' unit tests run by promtool."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from stack import tools

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "collector-config"
PROM = CONFIG / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROM / "tests").glob("*.test.yml"))


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _rules() -> list[dict[str, Any]]:
    return [
        rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
    ]


def _alerts() -> set[str]:
    return {r["alert"] for r in _rules() if "alert" in r}


def test_promtool_checks_the_prometheus_config_and_rules() -> None:
    promtool = tools.require("promtool")
    out = _run(promtool, "check", "config", str(PROM / "prometheus.yml"))
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in out
    out = _run(promtool, "check", "rules", *map(str, RULE_FILES))
    assert out.count("SUCCESS") == len(RULE_FILES)


def test_promtool_unit_tests_pass() -> None:
    promtool = tools.require("promtool")
    out = _run(promtool, "test", "rules", *map(str, RULE_TESTS))
    assert out.count("SUCCESS") == len(RULE_TESTS), out


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """The same tests against rules with a wrong threshold fail: they pin the behaviour."""
    promtool = tools.require("promtool")
    for path in (PROM / "rules").glob("*.yml"):
        text = path.read_text()
        if path.name == "otelprof-thresholds.yml":
            text = text.replace("vector(600)", "vector(60)")  # stalls alert 9 minutes early
        (tmp_path / "rules").mkdir(exist_ok=True)
        (tmp_path / "rules" / path.name).write_text(text)
    (tmp_path / "tests").mkdir()
    test = tmp_path / "tests" / "alerts.test.yml"
    test.write_text((PROM / "tests" / "otelprof-alerts.test.yml").read_text())
    done = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "OtelprofTrainingStalled" in done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert _alerts() == {
        "OtelprofTrainingStalled",
        "OtelprofStepTimeRegression",
        "OtelprofThroughputDrop",
        "OtelprofStragglerRank",
        "OtelprofInputBound",
        "OtelprofGpuMemoryNearCapacity",
        "OtelprofMfuDrop",
        "OtelprofExportDropping",
        "OtelprofExportSpooling",
        "OtelprofTelemetryDropped",
        "OtelprofMetricsEndpointDown",
        "OtelCollectorDown",
        "OtelCollectorExportFailing",
    }
    assert _alerts() - firing == set(), "alerts without a firing test"
    assert _alerts() - quiet == set(), "alerts without a not-firing test"


def test_thresholds_are_defined_once_and_documented() -> None:
    thresholds = [r["record"] for r in _rules() if r.get("record", "").startswith("otelprof:threshold:")]
    assert len(thresholds) == len(set(thresholds))
    used = {m for r in _rules() if "alert" in r for m in re.findall(r"otelprof:threshold:\w+", r["expr"])}
    assert used == set(thresholds), "a threshold no alert uses, or an alert using an undefined one"
    override = yaml.safe_load((PROM / "tests" / "overrides" / "otelprof-thresholds.yml").read_text())
    assert {r["record"] for g in override["groups"] for r in g["rules"]} == set(thresholds)
    readme = (CONFIG / "README.md").read_text()
    for name in thresholds:
        assert f"`{name}`" in readme, f"{name} is not in collector-config/README.md"
    for alert in _alerts():
        assert f"`{alert}`" in readme, f"{alert} is not in collector-config/README.md"


def test_rules_never_use_a_job_label_from_the_process() -> None:
    """Prometheus renames a scraped `job` label to `exported_job`; otelprof never sets one."""
    for rule in _rules():
        assert "exported_job" not in rule["expr"]


def test_amtool_checks_the_alertmanager_config() -> None:
    amtool = tools.require("amtool")
    out = _run(amtool, "check-config", str(CONFIG / "alertmanager" / "alertmanager.yml"))
    assert "SUCCESS" in out
    config = yaml.safe_load((CONFIG / "alertmanager" / "alertmanager.yml").read_text())
    named = {m for rule in config["inhibit_rules"] for k in ("source_matchers", "target_matchers") for m in rule[k]}
    mentioned = {n for matcher in named for n in re.findall(r"Otel\w+", matcher)}
    assert mentioned <= _alerts(), "an inhibition names an alert that does not exist"
