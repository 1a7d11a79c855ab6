"""The chart's RBAC grants exactly what the gateway uses: no verb more, none missing.

As tests/operator/integration/test_rbac.py does for the operator (the shared pieces: tests/rbacaudit.py):
the verbs are not listed by hand. The real ``modelpool-gateway`` runs as the chart's gateway ServiceAccount,
in the namespace ``modelpool-audit`` (whose ServiceAccounts the API server's audit log records), bound to the
chart's own gateway rules (gateway-rbac.yaml, gateway-keys-rbac.yaml, rendered by the real helm), with the
chart's settings (its Deployment's args and env). It does everything it does: it lists and watches pools,
pods and key Secrets; a key Secret is added (the key works) and deleted (it no longer does); a request for a
pool at zero is held (no operator runs: nothing wakes the pool), so that the pool's demand Lease is read,
created, read again and updated; the pool is then deleted, which answers the held request. The audit log
says which (API group, resource, verb) it requested: a 403 is a missing verb, a granted verb never requested
an extra one. Secrets being every Secret of a namespace to RBAC, the namespaces they are read in must also be
exactly those the chart grants.

Both key settings are run: the default (the gateway routes to every namespace through a ClusterRoleBinding;
key Secrets in the keys namespace only, ``<release namespace>-keys``, never the release namespace's) and
``gateway.auth.tenantKeys`` (routed namespaces bound with RoleBindings; key Secrets also read there, one of
them a tenant's key). The chart's Lease policy is applied too: the real gateway's demand Leases pass it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelpool_contract.gateway_keys import default_keys_namespace
from testkit.auditlog import token_kubeconfig
from testkit.cluster import Cluster
from testkit.kubectl import apply, wait_for
from tests.gateway.integration.conftest import StartGateway
from tests.gateway.integration.gwharness import GatewayProcess, bearer, create_key
from tests.operator.integration.opharness import POOLS, pool_manifest
from tests.rbacaudit import (
    AUDITED_NAMESPACE,
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

# Its Lease policy too (gateway-leasepolicy.yaml): the real gateway's demand Leases must pass it.
IDENTITY_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
LEASE_UPDATE = ("coordination.k8s.io", "leases", "update")
# The demand Lease is written once an interval while a request is held: short, so the update comes soon.
DEMAND_INTERVAL_S = 1
# The chart's default keys namespace for the audited release namespace (created here, as an admin would).
KEYS_NAMESPACE = default_keys_namespace(AUDITED_NAMESPACE)


@dataclass
class AuditedGateway:
    """The chart's gateway identity applied to the cluster, for a ServiceAccount whose requests the audit log
    records; ``kubeconfig`` authenticates as it."""

    cluster: Cluster
    name: str
    docs: list[dict[str, Any]]
    identity: list[dict[str, Any]]
    kubeconfig: Path
    secrets: list[tuple[str, str]] = field(default_factory=list)  # (namespace, name) of its key Secrets

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{AUDITED_NAMESPACE}:{gateway_name(self.name)}"

    def requests(self) -> list[dict[str, Any]]:
        return audited_requests(self.cluster, self.username)

    def _container(self) -> dict[str, Any]:
        [deployment] = [
            d
            for d in self.docs
            if d["kind"] == "Deployment" and d["metadata"]["name"] == gateway_name(self.name)
        ]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        return dict(container)

    def flags(self) -> list[str]:
        """The Deployment's args, but the port (the harness gives each gateway a free one)."""
        return [a for a in self._container()["args"] if not a.startswith("--port")]

    def env(self) -> dict[str, str]:
        """The Deployment's environment (its own namespace AUDITED_NAMESPACE, its keys KEYS_NAMESPACE)."""
        return {e["name"]: e["value"] for e in self._container()["env"]}

    def key_namespaces(self) -> set[str]:
        """Where the chart lets it read Secrets."""
        return {d["metadata"]["namespace"] for d in self.identity if d["kind"] == "Role"}


def gateway_name(release: str) -> str:
    return f"{release}-modelpool-operator-gateway"


@pytest.fixture
def audited(crds: Cluster, tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], AuditedGateway]]:
    """A factory: ``audited(values)`` renders the chart with ``values`` and applies its gateway identity for a
    fresh release; everything (and its key Secrets) is deleted again at teardown (after the gateways stopped:
    tests request this fixture before ``start_gateway``)."""
    require_audit_log(crds)
    crds.kubectl("create", "namespace", KEYS_NAMESPACE, check=False)
    made: list[AuditedGateway] = []

    def make(values: dict[str, Any]) -> AuditedGateway:
        name = f"audit-gw-{secrets.token_hex(3)}"
        docs = render_chart(crds, name, values, tmp_path)
        identity = [
            d
            for d in docs
            if d["kind"] in IDENTITY_KINDS and d["metadata"]["name"].startswith(gateway_name(name))
        ]
        assert {d["kind"] for d in identity} >= {"ServiceAccount", "ClusterRole", "Role"}, (
            "the gateway's identity"
        )
        apply_docs(crds, identity)
        kubeconfig = token_kubeconfig(
            crds, AUDITED_NAMESPACE, gateway_name(name), tmp_path / f"{name}.kubeconfig"
        )
        release = AuditedGateway(crds, name, docs, identity, kubeconfig)
        made.append(release)
        return release

    yield make
    for release in made:
        for where, secret in release.secrets:
            crds.kubectl("delete", "secret", secret, "-n", where, "--ignore-not-found", "--wait=false")
        delete_docs(crds, release.identity)


def _models(gateway: GatewayProcess, key: str) -> httpx.Response:
    return httpx.get(gateway.url + "/v1/models", headers=bearer(key), timeout=5)


def _exercise(
    crds: Cluster, namespace: str, start_gateway: StartGateway, release: AuditedGateway, key_namespace: str
) -> None:
    """Everything the gateway does, as the audited ServiceAccount with the chart's settings: its watches, a
    key Secret of ``key_namespace`` added and deleted, and a request held for a pool at zero (the demand
    Lease read, created and updated), answered when the pool is deleted."""
    admin = f"{release.name}-admin"
    release.secrets.append((KEYS_NAMESPACE, admin))
    admin_key = create_key(crds, KEYS_NAMESPACE, admin, namespaces="*")
    gateway = start_gateway([], *release.flags(), kubeconfig=release.kubeconfig, env=release.env())
    assert gateway.keys_namespace is None, "the chart's keys namespace, not the harness's"

    added = f"{release.name}-added"
    release.secrets.append((key_namespace, added))
    key = create_key(crds, key_namespace, added)
    wait_for(lambda: _models(gateway, key).status_code == 200, timeout=30, message="the added key works")
    crds.kubectl("delete", "secret", added, "-n", key_namespace)
    wait_for(lambda: _models(gateway, key).status_code == 401, timeout=30, message="the deleted key refused")

    apply(crds, pool_manifest("wanted", replicas=0), namespace)
    wait_for(lambda: "wanted" in _ids(gateway, admin_key), timeout=30, message="the gateway knows the pool")
    body = {"model": "wanted", "input": ["x"]}
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            httpx.post, gateway.url + "/v1/embeddings", json=body, headers=bearer(admin_key), timeout=60
        )
        wait_for(
            lambda: LEASE_UPDATE in {rule_of(e) for e in release.requests()},
            timeout=30,
            message="the held request's demand Lease created, then updated",
        )
        crds.kubectl("delete", POOLS, "wanted", "-n", namespace, "--wait=true", "--timeout=60s")
        answer = held.result(timeout=30)
    assert answer.status_code == 404 and "deleted" in answer.text, answer.text


def _ids(gateway: GatewayProcess, key: str) -> list[str]:
    return [m["id"] for m in _models(gateway, key).json()["data"]]


def _compare(release: AuditedGateway) -> None:
    requests = release.requests()
    assert_exactly_used("the gateway", requests, granted(release.identity))
    read = {e["objectRef"].get("namespace") for e in requests if e["objectRef"]["resource"] == "secrets"}
    assert read == release.key_namespaces(), "Secrets read exactly where the chart lets the gateway read them"


def test_default_gateway_rbac_is_exactly_what_the_gateway_uses(
    crds: Cluster,
    namespace: str,
    audited: Callable[[dict[str, Any]], AuditedGateway],
    start_gateway: StartGateway,
) -> None:
    """The chart's defaults: every namespace routed (a ClusterRoleBinding), key Secrets of the keys
    namespace only (never the release namespace's)."""
    release = audited({"gateway": {"demandIntervalSeconds": DEMAND_INTERVAL_S}})
    assert release.key_namespaces() == {KEYS_NAMESPACE}
    _exercise(crds, namespace, start_gateway, release, KEYS_NAMESPACE)
    _compare(release)


def test_tenant_keys_gateway_rbac_is_exactly_what_the_gateway_uses(
    crds: Cluster,
    namespace: str,
    audited: Callable[[dict[str, Any]], AuditedGateway],
    start_gateway: StartGateway,
) -> None:
    """``gateway.auth.tenantKeys`` with the routed namespace: RoleBindings there, and a tenant's key Secret
    read there (granting its own namespace)."""
    release = audited(
        {
            "scope": {"clusterWide": False, "namespaces": [namespace]},
            "gateway": {"demandIntervalSeconds": DEMAND_INTERVAL_S, "auth": {"tenantKeys": True}},
        }
    )
    assert release.key_namespaces() == {KEYS_NAMESPACE, namespace}
    _exercise(crds, namespace, start_gateway, release, namespace)
    _compare(release)
    # Routed to that namespace only: nothing read elsewhere (but key Secrets in the keys namespace).
    elsewhere = {
        e["objectRef"].get("namespace") for e in release.requests() if e["objectRef"]["resource"] != "secrets"
    }
    assert elsewhere == {namespace}
