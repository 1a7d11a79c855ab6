"""The chart's RBAC grants exactly what the operator uses: no verb more, none missing.

The verbs the operator uses are not listed by hand: the real operator runs as a ServiceAccount of the
namespace ``modelpool-audit`` bound to the chart's own rules (rendered by the real helm), does everything it
does with the chart's settings (a pool created, scaled up and down with an eviction, the operator restarted
so the pool's Service, NetworkPolicy and PodDisruptionBudget are brought up to date, then the pool turned
shared so they are deleted; the operator watches them throughout, to make a deleted one again), the
ModelBudget created by the operator itself (budget.create: a create at each start, 409 once it exists), a
text-generation pool's InferencePool made, patched and removed (inferencePool.enabled, the InferencePool CRD
installed), the pool and the ModelBudget deleted, Events posted, the leader election Lease, Kopf's peering),
and the API server's audit log (hack/audit-policy.yaml records exactly that namespace's ServiceAccounts) says
which (API group, resource, verb) it requested. A request the rules refuse (403) is a missing verb; a granted
verb no request used is an extra one. Both scopes are run: namespace scope with the chart's defaults (leader
election on a Lease in the release namespace, no Kopf peering), cluster scope with the deprecated
ClusterKopfPeering on too. The pieces shared with the gateway's test (test_gateway_rbac.py) are in
tests/rbacaudit.py.

The operator runs under the chart's policy on its own writes (templates/operatorpolicy.yaml, enforced
before it starts): everything it makes, patches and deletes here (workers, a host pod, the control key
Secret created and, after the restart, patched; the Service, the NetworkPolicy and the pool's and the
ModelHost's PodDisruptionBudgets created and patched, an eviction, a deletion) is admitted, or the test
fails naming the refused request.

One grant is never a request: ``update`` on ``modelpools/finalizers``, which the
OwnerReferencesPermissionEnforcement admission plugin (enabled on the local control plane) checks when a
worker pod is created with ``blockOwnerDeletion``; without it the pod creations would be refused (403),
which this test would see.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from modelpool_contract.picker import INFERENCE_GROUP, INFERENCE_POOL_PLURAL
from testkit.auditlog import token_kubeconfig
from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, wait_for
from testkit.services import KWOK_GPU_PLACEMENT, host_manifest
from tests.operator.integration.opharness import (
    POOLS,
    TO_SHARED,
    StartOperator,
    install_inference_pool_crd,
    pool_manifest,
    remove_inference_pool_crd,
    wait_status,
    worker_pods,
)
from tests.rbacaudit import (
    AUDITED_NAMESPACE,
    Rule,
    apply_docs,
    assert_exactly_used,
    audited_requests,
    delete_docs,
    granted,
    render_chart,
    require_audit_log,
    rule_of,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# The kinds of the chart that make up the operator's identity and peering.
IDENTITY_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
# The chart's policies on the operator's own writes (each a policy and its binding: "<fullname>-writes",
# "<fullname>-lease").
POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
OWN_WRITES_POLICY = "templates/operatorpolicy.yaml"
PEERING_KINDS = {"KopfPeering", "ClusterKopfPeering"}
# Granted, but checked by admission rather than requested (see the module docstring).
NOT_A_REQUEST = frozenset(
    {
        ("modelpool.dev", "modelpools/finalizers", "update"),
        ("modelpool.dev", "modelhosts/finalizers", "update"),
    }
)


@dataclass
class AuditedRelease:
    """The chart's RBAC (and peering objects) applied to the cluster, for a ServiceAccount whose requests the
    audit log records; ``kubeconfig`` authenticates as it."""

    cluster: Cluster
    name: str
    docs: list[dict[str, Any]]
    kubeconfig: Path
    budget: str
    applied: list[dict[str, Any]] = field(default_factory=list)

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{AUDITED_NAMESPACE}:{self.name}-modelpool-operator"

    def granted(self) -> set[Rule]:
        return granted(self.docs)

    def operator_env(self) -> dict[str, str]:
        """The settings the chart gives the operator besides ``config`` (whom the pools' NetworkPolicies
        admit; the budget it creates when missing, and what it does meanwhile; its leader election Lease), as
        its Deployment sets them."""
        [deployment] = [
            d for d in self.docs if d["kind"] == "Deployment" and "gateway" not in d["metadata"]["name"]
        ]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        prefixes = (
            "MODELPOOL_OPERATOR_NETWORK_POLICY_",
            "MODELPOOL_OPERATOR_LEADER_ELECTION",
            "MODELPOOL_OPERATOR_INFERENCE_POOLS_",
        )
        budget = {f"MODELPOOL_OPERATOR_{n}" for n in ("BUDGET_CREATE", "BUDGET_MEMORY", "MISSING_BUDGET")}
        return {
            e["name"]: e["value"]
            for e in container["env"]
            if e["name"].startswith(prefixes) or e["name"] in budget
        }

    def requests(self) -> list[dict[str, Any]]:
        """Every audited request this ServiceAccount made that names a resource."""
        return audited_requests(self.cluster, self.username)

    def used(self) -> set[Rule]:
        return {rule_of(e) for e in self.requests()}


@pytest.fixture
def audited(crds: Cluster, tmp_path: Path) -> Iterator[Any]:
    """A factory: ``audited(values)`` renders the chart with ``values`` and applies its RBAC and peering
    objects for a fresh release; everything is deleted again at teardown (after the operators stopped:
    tests request this fixture before ``start_operator``)."""
    require_audit_log(crds)
    install_inference_pool_crd(crds)
    releases: list[AuditedRelease] = []

    def make(values: dict[str, Any]) -> AuditedRelease:
        name = f"audit-{secrets.token_hex(3)}"
        # The operator's identity only: the gateway and the uninstall hook have ServiceAccounts and rules
        # of their own.
        only_operator = {"gateway": {"enabled": False}, "uninstallCleanup": {"enabled": False}}
        # The operator creates its budget (budget.create): its `create` is granted, and used.
        budget = {"budget": {"create": True, "memory": "100Gi"}}
        # It makes and removes a pool's InferencePool (inferencePool.enabled; the CRD installed below).
        inference = {"inferencePool": {"enabled": True}}
        docs = render_chart(crds, name, {**values, **only_operator, **budget, **inference}, tmp_path)
        crd_docs = [d for d in docs if d["kind"] == "CustomResourceDefinition" and "kopf.dev" in str(d)]
        for crd in crd_docs:  # Kopf's peering CRDs (the other tests may have installed them already)
            crds.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd))
        wanted = [d for d in docs if d["kind"] in IDENTITY_KINDS | PEERING_KINDS]
        # The policies on its writes, its leader election Lease's included ("-lease").
        policies = ("-writes", "-lease")
        wanted += [d for d in docs if d["kind"] in POLICY_KINDS and d["metadata"]["name"].endswith(policies)]
        assert len(wanted) > 2 and {d["kind"] for d in wanted} >= POLICY_KINDS, (
            f"{OWN_WRITES_POLICY} rendered"
        )
        apply_docs(crds, wanted)
        release = AuditedRelease(
            cluster=crds,
            name=name,
            docs=docs,
            kubeconfig=token_kubeconfig(
                crds, AUDITED_NAMESPACE, f"{name}-modelpool-operator", tmp_path / f"{name}.kubeconfig"
            ),
            budget=f"{name}-budget",
            applied=wanted,
        )
        releases.append(release)
        return release

    yield make
    for release in releases:
        delete_docs(crds, release.applied)
    remove_inference_pool_crd(crds)


def _compare(release: AuditedRelease) -> None:
    denied = [
        f"{e['verb']} {e['objectRef'].get('resource')} {e['objectRef'].get('name')}: "
        f"{(e.get('responseStatus') or {}).get('message')}"
        for e in release.requests()
        if "ValidatingAdmissionPolicy" in str((e.get("responseStatus") or {}).get("message"))
    ]
    assert not denied, f"the policy on the operator's writes refused the operator's own requests: {denied}"
    assert_exactly_used("the operator", release.requests(), release.granted(), NOT_A_REQUEST)


def _wait_for_the_policy(crds: Cluster, namespace: str, release: AuditedRelease) -> None:
    """Until the API server enforces the policy on the operator's writes: a pod the operator never makes
    (no owner) is refused to its ServiceAccount. Asked by impersonation (``--as``), so the audit log
    (which records the ServiceAccount's own requests) does not count the probe."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/probe:1"}]},
    }

    def refused() -> bool:
        done = crds.kubectl(
            "create", "-n", namespace, "-f", "-", "--dry-run=server", f"--as={release.username}",
            input=json.dumps(probe), check=False,
        )  # fmt: skip
        return done.returncode != 0 and "ModelPool or ModelHost controls" in done.stderr

    wait_for(refused, timeout=60, interval=0.5, message="the policy on the operator's writes is enforced")


# A ModelHost whose one host pod lands on a KWOK GPU node (nothing runs in it).
KWOK_HOST = host_manifest("audited", replicas=1, gpusPerHost=1, deviceMemory="8Gi", **KWOK_GPU_PLACEMENT)


def _exercise(
    crds: Cluster,
    namespace: str,
    start_operator: StartOperator,
    release: AuditedRelease,
    *,
    scope: list[str],
    peering: str | None,
) -> None:
    """Everything the operator does, run as the audited ServiceAccount with the chart's settings: a budget,
    a ModelHost with one KWOK host pod (its Secret, pod, status, finalizer), and a pool of two KWOK
    workers (pods, the Service, the NetworkPolicy, status, Events, the budget's status,
    Kopf's finalizers and peering), a text-generation pool's InferencePool (made, patched after the restart,
    removed with its field), a scale-down (an eviction patch, then a deletion), a restart (the
    existing Service and NetworkPolicy patched), the pool turned shared (its Service, NetworkPolicy and
    PodDisruptionBudget deleted; the owned objects' watches list and watch throughout), and the
    pool and the budget deleted while the operator runs (Kopf removes its finalizers). The budget is the
    operator's to create (budget.create): made at its first start, found existing (409) at its restart."""
    env = {**release.operator_env(), "MODELPOOL_OPERATOR_BUDGET_NAME": release.budget}
    assert env["MODELPOOL_OPERATOR_NETWORK_POLICY_ENABLED"] == "true", "the chart's default"
    assert env["MODELPOOL_OPERATOR_MISSING_BUDGET"] == "refuse", "the chart's default"
    _wait_for_the_policy(crds, namespace, release)
    operator = start_operator(*scope, peering=peering, kubeconfig=release.kubeconfig, **env)
    try:
        wait_for(
            lambda: (
                '"100Gi"'
                in crds.kubectl("get", "modelbudget", release.budget, "-o", "json", check=False).stdout
            ),
            timeout=60,
            message="the operator created its budget",
        )
        apply(crds, pool_manifest("audited", replicas=2, max_replicas=4), namespace)
        # A text-generation pool with spec.inferencePool: its InferencePool made, patched after the restart,
        # removed (a list by name, a delete) with the field.
        llm = pool_manifest("llm", task="text-generation")
        llm["spec"]["inferencePool"] = {"endpointPicker": "epp", "pickerPodLabels": {"app": "epp"}}
        apply(crds, llm, namespace)
        # A ModelHost: its daemon makes the control key Secret and a host pod, and writes its status.
        apply(crds, KWOK_HOST, namespace)
        wait_status(
            crds, namespace, "audited", lambda s: s.get("readyReplicas") == 2, timeout=90, message="2 ready"
        )
        wait_for(
            lambda: (
                (get_json(crds, "modelhost", "audited", "-n", namespace).get("status") or {}).get(
                    "readyReplicas"
                )
                == 1
            ),
            timeout=90,
            message="the host pod ready and the ModelHost's status written",
        )
        wait_for(
            lambda: (get_json(crds, "modelbudget", release.budget).get("status") or {}).get("usedBytes"),
            timeout=60,
            message="the budget's status written",
        )
        patch = ["--type", "merge", "-p", '{"spec": {"replicas": 1}}']
        crds.kubectl("patch", POOLS, "audited", "-n", namespace, *patch)
        wait_for(lambda: len(worker_pods(crds, namespace, "audited")) == 1, timeout=90, message="scaled to 1")
        assert operator.stop() == 0
        operator = start_operator(*scope, peering=peering, kubeconfig=release.kubeconfig, **env)
        wait_for(
            lambda: (
                {
                    ("", "services", "patch"),
                    ("networking.k8s.io", "networkpolicies", "patch"),
                    ("policy", "poddisruptionbudgets", "patch"),
                    ("", "secrets", "patch"),
                    (INFERENCE_GROUP, INFERENCE_POOL_PLURAL, "patch"),
                }
                <= release.used()
            ),
            timeout=90,
            message=(
                "the restarted operator brought the Service, NetworkPolicy, PodDisruptionBudget, control "
                "key and InferencePool up to date"
            ),
        )
        removal = ["--type", "json", "-p", '[{"op": "remove", "path": "/spec/inferencePool"}]']
        crds.kubectl("patch", POOLS, "llm", "-n", namespace, *removal)
        wait_for(
            lambda: (INFERENCE_GROUP, INFERENCE_POOL_PLURAL, "delete") in release.used(),
            timeout=90,
            message="the InferencePool removed with the field",
        )
        # The pool turned shared (spec.host): its Service, NetworkPolicy and PodDisruptionBudget removed
        # (a list by name each, a delete with its uid as precondition).
        shared = ["--type", "merge", "-p", json.dumps({"spec": TO_SHARED | {"host": "audited"}})]
        crds.kubectl("patch", POOLS, "audited", "-n", namespace, *shared)
        removed = {
            ("", "services", "delete"),
            ("networking.k8s.io", "networkpolicies", "delete"),
            ("policy", "poddisruptionbudgets", "delete"),
        }
        wait_for(lambda: removed <= release.used(), timeout=90, message="a shared pool's objects removed")
    finally:
        # While the operator runs, so that it removes its finalizers.
        crds.kubectl(
            "delete", POOLS, "audited", "llm", "-n", namespace, "--ignore-not-found", "--timeout=60s"
        )
        crds.kubectl("delete", "modelhost", "audited", "-n", namespace, "--ignore-not-found", "--timeout=60s")
        crds.kubectl("delete", "modelbudget", release.budget, "--ignore-not-found", "--timeout=60s")


def test_namespace_scope_rbac_is_exactly_what_the_operator_uses(
    crds: Cluster, namespace: str, audited: Any, start_operator: StartOperator
) -> None:
    """The chart's defaults but the scope (and inferencePool.enabled, as in every run here): leader election
    on its Lease, no Kopf peering."""
    release: AuditedRelease = audited({"scope": {"clusterWide": False, "namespaces": [namespace]}})
    _exercise(crds, namespace, start_operator, release, scope=[namespace], peering=None)
    _compare(release)
    assert ("", "namespaces", "list") in release.used(), "Kopf resolves the watched namespaces"
    # The Lease: created at the first start, renewed, released at the stop, taken again at the restart.
    lease = {("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")}
    assert lease <= release.used()
    names = {
        e["objectRef"].get("name")
        for e in release.requests()
        if e["objectRef"]["resource"] == "leases" and e["verb"] in ("get", "update")
    }
    assert names == {f"{release.name}-modelpool-operator"}, names


def test_cluster_scope_rbac_is_exactly_what_the_operator_uses(
    crds: Cluster, namespace: str, audited: Any, start_operator: StartOperator
) -> None:
    """Cluster scope: the operator acts on every namespace (this test's pool is the only one it is given);
    with the deprecated Kopf peering on too (its ClusterKopfPeering), besides the leader election."""
    peering = f"mp-audit-{secrets.token_hex(3)}"
    release: AuditedRelease = audited(
        {"scope": {"clusterWide": True}, "peering": {"enabled": True, "name": peering}}
    )
    _exercise(crds, namespace, start_operator, release, scope=[], peering=peering)
    _compare(release)
