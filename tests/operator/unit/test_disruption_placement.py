"""Disruption and placement of worker and host pods (issue 31, item 3), the pure parts: the
PodDisruptionBudgets the operator builds, the pods' affinity and default spread over nodes, the allowlist
on node affinity keys and the own-namespace rule of pod affinity, and the template hashes they leave alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from modelpool_contract.api import MSG_AFFINITY_NAMESPACES, ModelHostSpec, parse_pool_spec
from modelpool_operator.effects.disruption_budget import (
    build_host_budget,
    build_pool_budget,
    min_available,
)
from modelpool_operator.effects.resources import build_host_pod, build_worker_pod
from modelpool_operator.host import HostView, host_template_hash
from modelpool_operator.policy import (
    FIELD_HOST_NODE_AFFINITY,
    FIELD_NODE_AFFINITY,
    Policy,
    host_violations,
    msg_node_selector,
    node_affinity_keys,
    violations,
)
from modelpool_operator.pool import template_hash
from tests.operator.unit.op_planner import make_spec, view

SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "ScheduleAnyway",
    "labelSelector": {"matchLabels": {"modelpool.dev/pool": "p"}},
}


def _term(*keys: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": k, "operator": "In", "values": ["x"]} for k in keys]}


def _node_affinity(required: list[list[str]], preferred: list[list[str]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    node: dict[str, Any] = {}
    if required:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [_term(*t) for t in required]
        }
    if preferred:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 10, "preference": _term(*t)} for t in preferred
        ]
    return {"nodeAffinity": node}


def _host(**spec: Any) -> HostView:
    return HostView("ns", "gpus", ModelHostSpec.model_validate({"deviceMemory": "8Gi", **spec}), uid="uid-h")


# ---- the budgets -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "max_unavailable", "expected"), [(3, 1, 2), (1, 1, 0), (0, 1, 0), (3, 0, 3)]
)
def test_min_available_is_the_target_less_what_may_be_down(
    target: int, max_unavailable: int, expected: int
) -> None:
    assert min_available(target, max_unavailable) == expected


def test_a_pools_budget_selects_its_serving_workers_and_lets_unready_ones_go() -> None:
    pool = view(make_spec(replicas=4, disruption={"maxUnavailable": 2}))
    budget = build_pool_budget(pool, target=4)
    assert budget["kind"] == "PodDisruptionBudget" and budget["apiVersion"] == "policy/v1"
    assert budget["metadata"]["name"] == "modelpool-p" and budget["metadata"]["namespace"] == "ns"
    assert budget["spec"] == {
        "minAvailable": 2,
        "selector": {"matchLabels": {"modelpool.dev/pool": "p", "modelpool.dev/serving": "true"}},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    assert "maxUnavailable" not in budget["spec"]  # it would count from spec.replicas, not the target


def test_a_hosts_budget_counts_its_replicas() -> None:
    budget = build_host_budget(_host(replicas=3))
    assert budget["metadata"]["name"] == "modelhost-gpus"
    assert budget["metadata"]["ownerReferences"][0]["kind"] == "ModelHost"
    assert budget["spec"]["minAvailable"] == 2
    assert budget["spec"]["selector"] == {"matchLabels": {"modelpool.dev/pool": "host_gpus"}}
    assert build_host_budget(_host(replicas=3, disruption={"maxUnavailable": 0}))["spec"]["minAvailable"] == 3


def test_a_shared_pool_takes_no_disruption_field() -> None:
    spec = {"model": {"source": "/m", "task": "text-embedding"}, "resources": {"memory": "1Gi"}, "host": "h"}
    parse_pool_spec(spec)
    parse_pool_spec({**spec, "disruption": {"maxUnavailable": 1}})  # at its default: as unset (the CRD's too)
    with pytest.raises(ValidationError, match=r"spec\.disruption is the ModelHost's on a shared pool"):
        parse_pool_spec({**spec, "disruption": {"maxUnavailable": 2}})


def test_disruption_and_unset_scheduling_fields_roll_no_worker_nor_host_pod() -> None:
    """``disruption`` is the budget's, not the pod's; unset affinity and spread leave the hashes of pools and
    hosts made before these fields as they were (an upgrade rolls nothing)."""
    plain = make_spec()
    assert template_hash(plain) == template_hash(make_spec(disruption={"maxUnavailable": 3}))
    host = ModelHostSpec.model_validate({"deviceMemory": "8Gi"})
    assert host_template_hash(host) == host_template_hash(
        ModelHostSpec.model_validate({"deviceMemory": "8Gi", "disruption": {"maxUnavailable": 0}})
    )
    # As computed before these fields existed (the parent commit's code).
    assert host_template_hash(host) == "380e821d2f" and template_hash(plain) == "62c27f448d"
    spread = make_spec(podTemplate={"topologySpreadConstraints": []})
    assert template_hash(spread) != template_hash(plain)  # set: it shapes the pod


# ---- the pods' scheduling ----------------------------------------------------------------------------------


def test_workers_spread_softly_over_nodes_unless_the_pool_says_otherwise() -> None:
    pod = build_worker_pod(view(), "p-h1-0")
    assert pod["spec"]["topologySpreadConstraints"] == [SPREAD] and "affinity" not in pod["spec"]
    none = build_worker_pod(view(make_spec(podTemplate={"topologySpreadConstraints": []})), "p-h1-0")
    assert "topologySpreadConstraints" not in none["spec"]
    zone = {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
    own = build_worker_pod(view(make_spec(podTemplate={"topologySpreadConstraints": [zone]})), "p-h1-0")
    assert own["spec"]["topologySpreadConstraints"] == [zone]


def test_a_pools_affinity_reaches_its_workers() -> None:
    affinity = {
        **_node_affinity([["topology.kubernetes.io/zone"]]),
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"modelpool.dev/pool": "p"}},
                    },
                }
            ]
        },
    }
    pod = build_worker_pod(view(make_spec(podTemplate={"affinity": affinity})), "p-h1-0")
    assert pod["spec"]["affinity"] == affinity


def test_host_pods_spread_over_nodes_and_take_the_hosts_affinity() -> None:
    pod = build_host_pod(_host(replicas=2), 0)
    assert pod["spec"]["topologySpreadConstraints"] == [
        {**SPREAD, "labelSelector": {"matchLabels": {"modelpool.dev/pool": "host_gpus"}}}
    ]
    zoned = build_host_pod(_host(affinity=_node_affinity([["topology.kubernetes.io/zone"]])), 0)
    assert zoned["spec"]["affinity"] == _node_affinity([["topology.kubernetes.io/zone"]])


# ---- what a spec may ask for -------------------------------------------------------------------------------


def test_node_affinity_keys_obey_the_node_selector_allowlist_required_then_preferred() -> None:
    policy = Policy(node_selector_keys=("topology.kubernetes.io/zone", "kubernetes.io/arch"))
    allowed = _node_affinity([["topology.kubernetes.io/zone"]], [["kubernetes.io/arch"]])
    assert not violations(make_spec(podTemplate={"affinity": allowed}), policy, "ns")
    # A preference steers pods onto a node as surely: checked too, after the required terms.
    refused = _node_affinity([["topology.kubernetes.io/zone", "zz"]], [["kubernetes.io/hostname"]])
    assert node_affinity_keys(
        parse_pool_spec({**_minimal(), "podTemplate": {"affinity": refused}}).pod_template.affinity
    ) == [
        "topology.kubernetes.io/zone",
        "zz",
        "kubernetes.io/hostname",
    ]
    (found,) = violations(make_spec(podTemplate={"affinity": refused}), policy, "ns")
    assert found.field == FIELD_NODE_AFFINITY
    assert found.message == msg_node_selector(FIELD_NODE_AFFINITY, "zz", policy.node_selector_keys)
    only_preferred = _node_affinity([], [["kubernetes.io/hostname"]])
    (found,) = violations(make_spec(podTemplate={"affinity": only_preferred}), policy, "ns")
    assert "kubernetes.io/hostname is not a node label key" in found.message
    # A ModelHost's spec.affinity likewise.
    (found,) = host_violations(_host(affinity=only_preferred).spec, policy, "ns")
    assert found.field == FIELD_HOST_NODE_AFFINITY


def _minimal() -> dict[str, Any]:
    return {"model": {"source": "/m", "task": "text-embedding"}, "resources": {"memory": "1Gi"}}


@pytest.mark.parametrize(
    "term",
    [
        {"topologyKey": "kubernetes.io/hostname", "namespaces": ["team-b"]},
        {"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}},
        {"topologyKey": "kubernetes.io/hostname", "namespaces": []},
    ],
)
def test_pod_affinity_never_reaches_another_namespace(term: dict[str, Any]) -> None:
    for kind in ("podAffinity", "podAntiAffinity"):
        affinity = {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        with pytest.raises(ValidationError, match="namespaces and namespaceSelector are not supported"):
            parse_pool_spec({**_minimal(), "podTemplate": {"affinity": affinity}})
        weighted = {
            kind: {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": term}]
            }
        }
        with pytest.raises(ValidationError, match="namespaces and namespaceSelector are not supported"):
            ModelHostSpec.model_validate({"deviceMemory": "1Gi", "affinity": weighted})
    assert "own namespace only" in MSG_AFFINITY_NAMESPACES


def test_scheduling_lists_are_bounded() -> None:
    many = [{"maxSkew": 1, "topologyKey": f"k{i}", "whenUnsatisfiable": "ScheduleAnyway"} for i in range(9)]
    with pytest.raises(ValidationError, match="at most 8"):
        parse_pool_spec({**_minimal(), "podTemplate": {"topologySpreadConstraints": many}})
