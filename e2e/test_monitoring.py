"""What the chart gives a monitoring stack. The alerts (files/alerts.yaml): valid for Prometheus (``promtool
check rules``), each one firing on what should wake someone and quiet otherwise (``promtool test rules
e2e/alerts_test.yaml``), shipped unchanged as a PrometheusRule, reading only series the operator and the
gateway export. The Grafana dashboards (files/dashboards/, made by testkit.dashboards): as made, shipped as
ConfigMaps for the sidecar. e2e/test_images.py runs both against a real Prometheus scraping the released
images."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from e2e.helpers import CHART, by_kind, load_all, require_binary, run
from modelpool_gateway.metrics import Metrics as GatewayMetrics
from modelpool_operator.metrics import OperatorMetrics
from testkit import dashboards
from testkit.cluster import missing
from testkit.prometheus import CHART_ALERTS as ALERTS
from testkit.prometheus import rules_in, series_read

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
    return rules_in(ALERTS)


def _render(*values: str) -> list[dict[str, Any]]:
    """The chart as ``helm template`` renders it with ``values`` (``key=value``, each a --set)."""
    sets = [arg for value in values for arg in ("--set", value)]
    helm = str(require_binary("helm"))
    return load_all(run([helm, "template", "mp", str(CHART), "--namespace", "mp-system", *sets]).stdout)


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
    read = {name for rule in _rules() for name in series_read(rule["expr"])}
    assert read, "the alerts read modelpool's series"
    assert read - exported == set(), "series no program exports (a renamed metric?)"


def test_the_chart_ships_the_rules_unchanged_when_asked() -> None:
    assert not by_kind(_render(), "PrometheusRule"), "off by default"
    rendered = _render("metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=prom")
    [rule] = by_kind(rendered, "PrometheusRule")
    assert rule["metadata"]["namespace"] == "mp-system"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


def test_the_dashboard_files_are_what_testkit_dashboards_makes() -> None:
    assert dashboards.stale() == [], "run python -m testkit.dashboards --write"


def test_the_dashboards_read_only_series_the_operator_and_the_gateway_export() -> None:
    exported = _exported(OperatorMetrics().registry) | _exported(GatewayMetrics().registry)
    exprs = [q.expr for d in dashboards.DASHBOARDS for p in d.panels for q in p.queries]
    read = {
        n
        for e in exprs
        for n in series_read(e)
        if n.startswith(("modelpool_operator_", "modelpool_gateway_"))
    }
    assert read and read - exported == set()
    for dashboard in dashboards.DASHBOARDS:
        titles = [p.title for p in dashboard.panels]
        assert len(set(titles)) == len(titles), f"{dashboard.uid}: panels of one title"


def test_the_chart_ships_each_dashboard_as_a_configmap_for_the_sidecar_when_asked() -> None:
    def sidecar_maps(*values: str) -> list[dict[str, Any]]:
        docs = by_kind(_render(*values), "ConfigMap")
        return [d for d in docs if d["metadata"]["labels"].get("grafana_dashboard")]

    assert sidecar_maps() == [], "off by default"
    maps = sidecar_maps("dashboards.enabled=true", "dashboards.annotations.grafana_folder=modelpool")
    assert {m["metadata"]["name"] for m in maps} == {
        f"mp-modelpool-operator-dashboard-{d.uid.removeprefix('modelpool-')}" for d in dashboards.DASHBOARDS
    }
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "modelpool"}
        [(file, body)] = config_map["data"].items()
        assert body + "\n" == (dashboards.FOLDER / file).read_text()
