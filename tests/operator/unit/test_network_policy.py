"""The NetworkPolicies (``network_policy``) of a pool's workers and of a ModelHost's host pods: their exact
shape, and the settings they are built from."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from modelpool_contract.api import parse_host_spec
from modelpool_operator.effects.network_peers import NetworkPolicyPeer
from modelpool_operator.effects.network_policy import (
    PolicySettings,
    build_host_network_policy,
    build_network_policy,
    policy_name,
)
from modelpool_operator.effects.resources import build_host_pod
from modelpool_operator.host import HostView
from modelpool_operator.pool import PoolView
from modelpool_operator.services import policy_settings
from modelpool_operator.settings import OperatorConfig

OPERATOR = {"app.kubernetes.io/name": "modelpool-operator", "app.kubernetes.io/instance": "mp"}
GATEWAY = {"app.kubernetes.io/name": "modelpool-operator-gateway", "app.kubernetes.io/instance": "mp"}
APPS = {"namespaceSelector": {"matchLabels": {"team": "apps"}}}
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["prometheus"]}]},
}


def _pool(uid: str | None = "u-1") -> PoolView:
    meta: dict[str, Any] = {"name": "emb", "namespace": "team"}
    if uid:
        meta["uid"] = uid
    spec = {"model": {"source": "/models/m", "task": "text-embedding"}, "resources": {"memory": "1Gi"}}
    return PoolView.from_body({"metadata": meta, "spec": spec})


def _in_release(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mp-system"}},
        "podSelector": {"matchLabels": labels},
    }


# The operator, the gateway, callers and metrics scrapers named.
EVERYONE = PolicySettings(
    namespace="mp-system",
    operator_labels=OPERATOR,
    gateway_labels=GATEWAY,
    callers=(NetworkPolicyPeer.model_validate(APPS),),
    metrics_callers=(NetworkPolicyPeer.model_validate(PROMETHEUS),),
)


def test_the_policy_admits_the_operator_the_gateway_and_the_named_callers_port_by_port() -> None:
    settings = EVERYONE
    assert build_network_policy(_pool(), settings) == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "modelpool-emb",
            "namespace": "team",
            "labels": {"modelpool.dev/pool": "emb", "app.kubernetes.io/managed-by": "modelpool-operator"},
            "ownerReferences": [
                {
                    "apiVersion": "modelpool.dev/v1alpha1",
                    "kind": "ModelPool",
                    "name": "emb",
                    "uid": "u-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "podSelector": {"matchLabels": {"modelpool.dev/pool": "emb"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "ports": [{"port": "probes", "protocol": "TCP"}],
                    "from": [_in_release(OPERATOR), PROMETHEUS],
                },
                {
                    "ports": [{"port": "http", "protocol": "TCP"}],
                    "from": [_in_release(OPERATOR), _in_release(GATEWAY), APPS],
                },
            ],
        },
    }


def test_a_modelhosts_policy_admits_the_operator_alone_to_its_control_port() -> None:
    """Host pods had no policy: anyone in the cluster could load, unload, sleep and wake their models (the
    control key aside) and call every model on them past the gateway."""
    settings = EVERYONE
    host = HostView("team", "gpus", parse_host_spec({"deviceMemory": "8Gi"}), uid="h-1")
    policy = build_host_network_policy(host, settings)
    assert policy == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "modelhost-gpus",
            "namespace": "team",
            "labels": {
                "modelpool.dev/host": "gpus",
                "modelpool.dev/pool": "host_gpus",
                "app.kubernetes.io/managed-by": "modelpool-operator",
            },
            "ownerReferences": [
                {
                    "apiVersion": "modelpool.dev/v1alpha1",
                    "kind": "ModelHost",
                    "name": "gpus",
                    "uid": "h-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "podSelector": {"matchLabels": {"modelpool.dev/pool": "host_gpus"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                # The control API: no metrics scraper, no caller, no gateway.
                {"ports": [{"port": "probes", "protocol": "TCP"}], "from": [_in_release(OPERATOR)]},
                {
                    "ports": [{"port": "http", "protocol": "TCP"}],
                    "from": [_in_release(OPERATOR), _in_release(GATEWAY), APPS],
                },
            ],
        },
    }
    # It selects the host pods, on the ports they name; a pool's policy name can never be it.
    pod = build_host_pod(host, 0)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert {p["name"] for p in pod["spec"]["containers"][0]["ports"]} == {"http", "probes"}
    assert not policy["metadata"]["name"].startswith(policy_name(""))
    unowned = build_host_network_policy(HostView("team", "gpus", host.spec), settings)
    assert "ownerReferences" not in unowned["metadata"]


def test_without_a_gateway_or_callers_only_the_operator_is_admitted() -> None:
    policy = build_network_policy(_pool(uid=None), PolicySettings(namespace="ops", operator_labels=OPERATOR))
    operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
        "podSelector": {"matchLabels": OPERATOR},
    }
    assert [rule["from"] for rule in policy["spec"]["ingress"]] == [[operator], [operator]]
    assert "ownerReferences" not in policy["metadata"]  # no uid yet: nothing to own it by
    assert policy_name("emb") == policy["metadata"]["name"]


def test_the_settings_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "ENABLED": "true",
        "NAMESPACE": "mp-system",
        "OPERATOR_LABELS": json.dumps(OPERATOR),
        "GATEWAY_LABELS": json.dumps(GATEWAY),
        "FROM": json.dumps([APPS, {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]),
        "METRICS_FROM": json.dumps([PROMETHEUS]),
    }
    for name, value in env.items():
        monkeypatch.setenv(f"MODELPOOL_OPERATOR_NETWORK_POLICY_{name}", value)
    settings = policy_settings(OperatorConfig())
    assert settings is not None
    assert (settings.namespace, settings.operator_labels, settings.gateway_labels) == (
        "mp-system",
        OPERATOR,
        GATEWAY,
    )
    assert [p.wire() for p in settings.callers] == [
        APPS,
        {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
    ]
    assert [p.wire() for p in settings.metrics_callers] == [PROMETHEUS]


def test_off_by_default_outside_the_chart() -> None:
    assert policy_settings(OperatorConfig()) is None


def test_on_without_the_operators_pods_named_is_refused() -> None:
    """The policy would cut the operator itself off from the workers' /stats."""
    with pytest.raises(ValidationError, match="network_policy_operator_labels"):
        OperatorConfig(network_policy_enabled=True, network_policy_namespace="mp-system")
    with pytest.raises(ValidationError, match="network_policy_namespace"):
        OperatorConfig(network_policy_enabled=True, network_policy_operator_labels=OPERATOR)


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        ({}, "podSelector, namespaceSelector or ipBlock"),
        ({"podSelector": {"matchLabel": {"a": "b"}}}, "matchLabel"),
        ({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}, "cannot be combined"),
        ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}, "operator"),
    ],
)
def test_a_malformed_peer_is_refused_with_the_field_named(peer: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        OperatorConfig(network_policy_from=[peer])  # type: ignore[arg-type]
