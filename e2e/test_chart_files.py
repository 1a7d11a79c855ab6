"""The chart's files agree with the code they describe, without helm: its CRD copy is the generated crds/,
every operator setting has a documented value with the operator's own default, and every value is
commented and covered by the strict schema."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import yaml

from e2e.helpers import CHART, CHART_CRDS, CRDS
from modelpool_gateway.config import GatewaySettings
from modelpool_operator.policy import CLEAN_IMAGE_PATTERN, CLEAN_PATH_PATTERN
from modelpool_operator.settings import OperatorConfig
from testkit.docs import FREE_FORM
from testkit.environment import ROOT

VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES: dict[str, Any] = yaml.safe_load(VALUES_TEXT)
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())

# Settings the chart sets through the command line (scope, peering, liveness), not through `config`.
SET_BY_ARGS = {"namespaces", "peering_name", "standalone", "liveness_port", "metrics_port"}
# Settings the chart sets from its own objects, not from `config`: the control seed's file (its Secret
# mounted into the operator's pod) and the operator's own namespace (the release's); e2e/test_chart.py checks
# both.
SET_BY_CHART = {"control_seed_file", "own_namespace"}
# Settings the chart sets from `budget` (create, memory, missing): the budget's values live together there;
# e2e/test_chart.py checks them.
SET_BY_BUDGET = {"budget_create", "budget_memory", "missing_budget"}
# Set from `inferencePool.enabled` (with the RBAC on InferencePools it grants); e2e/test_chart.py checks it.
SET_BY_INFERENCE_POOL = {"inference_pools_enabled"}
# Set from `tracing` (the workers' traces, with the gateway's); e2e/test_chart.py checks them.
SET_BY_TRACING = {"worker_otlp_endpoint", "worker_trace_sample_ratio"}
# Settings the chart derives from `networkPolicy` (the release namespace, the operator's and the gateway's pod
# labels, the callers), not from `config`; e2e/test_chart.py checks what it sets.
SET_BY_NETWORK_POLICY = {
    "network_policy_enabled",
    "network_policy_namespace",
    "network_policy_operator_labels",
    "network_policy_gateway_labels",
    "network_policy_from",
    "network_policy_metrics_from",
}
# Settings the chart derives from `leaderElection` (and the release namespace); e2e/test_chart.py checks them.
SET_BY_LEADER_ELECTION = {
    "leader_election",
    "leader_election_lease_name",
    "leader_election_namespace",
    "leader_election_lease_duration_seconds",
    "leader_election_renew_deadline_seconds",
    "leader_election_retry_period_seconds",
}
# Chart values left empty so the operator's own default applies (the template sets no variable for them).
EMPTY_MEANS_DEFAULT = {"server_image", "peering_priority"}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_chart_crds_are_the_generated_crds() -> None:
    generated = sorted(p.name for p in CRDS.glob("*.yaml"))
    assert generated, "crds/ is empty: run `make crds`"
    result = subprocess.run(
        ["bash", str(ROOT / "hack" / "sync-chart-crds.sh"), "--check"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in CHART_CRDS.glob("*.yaml")) == generated


def test_every_operator_setting_is_a_chart_value_with_the_operator_default() -> None:
    config = VALUES["config"]
    fields = OperatorConfig.model_fields
    for key, value in config.items():
        name = _snake(key)
        assert name in fields, f"config.{key}: OperatorConfig has no field {name}"
        if name in EMPTY_MEANS_DEFAULT:
            assert value == ""
        else:
            # A list value (YAML) stands for a tuple field (the environment's comma-separated list).
            default = list(default) if isinstance(default := fields[name].default, tuple) else default
            assert value == default, f"config.{key}: {value!r} != {default!r}"
    covered = {_snake(k) for k in config} | SET_BY_ARGS | SET_BY_NETWORK_POLICY | SET_BY_CHART | SET_BY_BUDGET
    covered |= SET_BY_LEADER_ELECTION | SET_BY_INFERENCE_POOL | SET_BY_TRACING
    assert set(fields) == covered, f"settings without a chart value: {sorted(set(fields) - covered)}"


# gateway values -> the GatewaySettings field each one sets (through an environment variable or a flag).
GATEWAY_SETTINGS = {
    ("port",): "port",
    ("hold", "maxPerPool"): "max_held_per_pool",
    ("hold", "retryAfterSeconds"): "hold_retry_after_seconds",
    ("fairQueue", "maxPerKey"): "max_queued_per_key",
    ("fairQueue", "maxPerPool"): "max_queued_per_pool",
    ("demandIntervalSeconds",): "demand_interval_seconds",
    ("maxInFlight",): "max_in_flight",
    ("maxRequestBytes",): "max_request_bytes",
    ("shutdownGraceSeconds",): "shutdown_grace_seconds",
    ("logLevel",): "log_level",
    ("auth", "mode"): "auth",
    ("auth", "tenantKeys"): "tenant_keys",
}


def test_the_gateway_values_default_to_the_gateways_own_defaults() -> None:
    fields = GatewaySettings.model_fields
    for path, name in GATEWAY_SETTINGS.items():
        value: Any = VALUES["gateway"]
        for key in path:
            value = value[key]
        assert value == fields[name].default, (
            f"gateway.{'.'.join(path)}: {value!r} != {fields[name].default!r}"
        )
    template = (CHART / "templates" / "gateway.yaml").read_text()
    for name in GATEWAY_SETTINGS.values():
        assert f"MODELPOOL_GATEWAY_{name.upper()}" in template or f"--{name}=" in template, name


def _schema_keys(schema: dict[str, Any]) -> set[str]:
    return set(schema.get("properties", {}))


def _check_strict(values: dict[str, Any], schema: dict[str, Any], path: str) -> None:
    """Every object the values set is in the schema; closed objects reject unknown keys."""
    for key, value in values.items():
        assert key in _schema_keys(schema), f"{path}{key} is not in values.schema.json"
        sub = schema["properties"][key]
        if "$ref" in sub:
            continue
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
            _check_strict(value, sub, f"{path}{key}.")


def test_schema_is_strict_and_covers_every_value() -> None:
    assert SCHEMA["additionalProperties"] is False
    assert _schema_keys(SCHEMA) == set(VALUES)
    _check_strict(VALUES, SCHEMA, "")
    closed = [k for k, v in SCHEMA["properties"].items() if v.get("additionalProperties") is False]
    assert {
        "crds",
        "image",
        "scope",
        "peering",
        "config",
        "liveness",
        "budget",
        "metrics",
        "networkPolicy",
        "gateway",
    } <= set(closed)
    assert _schema_keys(SCHEMA["properties"]["config"]) == set(VALUES["config"])


def test_every_value_is_commented() -> None:
    lines = VALUES_TEXT.splitlines()
    parents: list[tuple[int, str]] = []
    undocumented = []
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):", line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        parents = [(i, k) for i, k in parents if i < indent]
        inside_free_form = any(k in FREE_FORM for _, k in parents)
        previous = lines[number - 1].strip() if number else ""
        if not inside_free_form and not previous.startswith("#"):
            undocumented.append(".".join([k for _, k in parents] + [key]))
        parents.append((indent, key))
    assert not undocumented, f"values without a comment: {undocumented}"


def test_the_admission_policy_and_the_schema_use_the_operators_path_and_image_rules() -> None:
    """One rule in three places: the operator's policy module, the chart's CEL and its values schema."""
    template = (CHART / "templates" / "admissionpolicy.yaml").read_text()
    assert f"r'{CLEAN_PATH_PATTERN}'" in template
    assert f"r'{CLEAN_IMAGE_PATTERN}'" in template
    items = SCHEMA["properties"]["config"]["properties"]["allowedHostPaths"]["items"]
    assert {"pattern": CLEAN_PATH_PATTERN} in items["allOf"]
