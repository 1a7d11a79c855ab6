"""What the chart gives a monitoring stack. The alerts (files/alerts.yaml): valid for Prometheus (``promtool
check rules``), each one firing on what should wake someone and quiet otherwise (``promtool test rules
e2e/alerts_test.yaml``), shipped unchanged as a PrometheusRule, reading only series the operator and the
gateway export. The Grafana dashboards (files/dashboards/, made by testkit.dashboards): as made, shipped as
ConfigMaps for the sidecar. e2e/test_images.py runs both against a real Prometheus scraping the released
images."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from e2e.helpers import CHART, require_binary, run
from modelpool_gateway.metrics import Metrics as GatewayMetrics
from modelpool_operator.metrics import OperatorMetrics
from testkit import dashboards
from testkit.cluster import missing

ALERTS = CHART / "files" / "alerts.yaml"
ALERT_TESTS = Path(__file__).parent / "alerts_test.yaml"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        missing("promtool is missing: `bash hack/tools.sh` installs Debian's prometheus package")
        raise AssertionError("unreachable")
    return path


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_rules_are_valid_for_prometheus(promtool: str) -> None:
    out = run([promtool, "check", "rules", ALERTS]).stdout
    assert f"SUCCESS: {len(_rules())} rules found" in out


def test_each_alert_fires_when_it_should_and_stays_quiet_otherwise(promtool: str) -> None:
    out = run([promtool, "test", "rules", ALERT_TESTS]).stdout
    assert "SUCCESS" in out and "FAILED" not in out, out


def test_every_alert_is_tested_firing_and_quiet() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    names = {rule["alert"] for rule in _rules()}
    assert names - fired == set(), "alerts no test sees firing"
    assert names - quiet == set(), "alerts no test sees quiet"


def _exported(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry can export, labelled families without children included."""
    return {
        family.name + suffix for family in registry.collect() for suffix in _SUFFIXES.get(family.type, ("",))
    }


def test_the_alerts_read_only_series_the_operator_and_the_gateway_export() -> None:
    exported = _exported(OperatorMetrics().registry) | _exported(GatewayMetrics().registry)
    read = {name for rule in _rules() for name in re.findall(r"\bmodelpool_[a-z_]+", rule["expr"])}
    assert read, "the alerts read modelpool's series"
    assert read - exported == set(), "series no program exports (a renamed metric?)"


def test_the_chart_ships_the_rules_unchanged_when_asked() -> None:
    helm = str(require_binary("helm"))
    base = [helm, "template", "mp", str(CHART), "--namespace", "mp-system"]
    assert "PrometheusRule" not in run(base).stdout, "off by default"
    rendered = run([*base, "--set", "metrics.prometheusRule.enabled=true",
                    "--set", "metrics.prometheusRule.labels.release=prom"]).stdout  # fmt: skip
    [rule] = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["namespace"] == "mp-system"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


def test_the_dashboard_files_are_what_testkit_dashboards_makes() -> None:
    assert dashboards.stale() == [], "run python -m testkit.dashboards --write"


def test_the_dashboards_read_only_series_the_operator_and_the_gateway_export() -> None:
    exported = _exported(OperatorMetrics().registry) | _exported(GatewayMetrics().registry)
    exprs = [q.expr for d in dashboards.DASHBOARDS for p in d.panels for q in p.queries]
    read = {n for e in exprs for n in re.findall(r"\bmodelpool_(?:operator|gateway)_[a-z_]+", e)}
    assert read and read - exported == set()
    for dashboard in dashboards.DASHBOARDS:
        titles = [p.title for p in dashboard.panels]
        assert len(set(titles)) == len(titles), f"{dashboard.uid}: panels of one title"


def test_the_chart_ships_each_dashboard_as_a_configmap_for_the_sidecar_when_asked() -> None:
    helm = str(require_binary("helm"))
    base = [helm, "template", "mp", str(CHART), "--namespace", "mp-system"]
    assert "grafana_dashboard" not in run(base).stdout, "off by default"
    rendered = run([*base, "--set", "dashboards.enabled=true",
                    "--set", "dashboards.annotations.grafana_folder=modelpool"]).stdout  # fmt: skip
    maps = [d for d in yaml.safe_load_all(rendered) if d and d["metadata"]["labels"].get("grafana_dashboard")]
    assert {m["metadata"]["name"] for m in maps} == {
        f"mp-modelpool-operator-dashboard-{d.uid.removeprefix('modelpool-')}" for d in dashboards.DASHBOARDS
    }
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "modelpool"}
        [(file, body)] = config_map["data"].items()
        assert body + "\n" == (dashboards.FOLDER / file).read_text()
