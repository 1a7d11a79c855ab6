"""The gateway's identity down to its job (issue 30, item 3), on the real API server, acting as the chart's
gateway ServiceAccount (``kubectl --as``, and the real ``modelpool-gateway`` with its token):

* it writes only demand Leases: the chart's ValidatingAdmissionPolicy (``gateway-leasepolicy.yaml``)
  refuses any other Lease create or update by it, with a message saying what it may write;
* it never sees the release namespace's Secrets (the operator's control seed, Helm's releases): its admin
  keys live in a namespace of their own (``gateway.auth.keysNamespace``), where a key still works end to
  end through the real gateway;
* it never routes a pool of its own (the release) namespace, even routing every namespace;
* in namespace scope it reads pods only in the namespaces it routes to (never the release namespace).

The release namespace is the test's fresh namespace; the chart is rendered by the real helm and only the
gateway's identity (and the control seed, to be refused) is applied: no operator runs.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelpool_contract.api import API_VERSION, MODELPOOL_KIND
from modelpool_contract.demand import demand_lease, demand_lease_name, read_demand, renew
from modelpool_contract.gateway_keys import default_keys_namespace
from testkit.auditlog import token_kubeconfig
from testkit.cluster import Cluster
from testkit.kubectl import apply, wait_for
from tests.gateway.integration.conftest import StartGateway
from tests.gateway.integration.gwharness import GatewayProcess, bearer, create_key
from tests.operator.integration.opharness import pool_manifest
from tests.rbacaudit import apply_docs, delete_docs, render_chart

pytestmark = pytest.mark.cluster

Doc = dict[str, Any]
# What of the rendered chart is applied: the gateway's identity, its keys namespace, its Lease policy and
# the operator's control seed (the Secret the gateway must not read).
APPLIED_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Namespace",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


@dataclass
class Release:
    """The chart's gateway identity applied for release ``name`` in namespace ``namespace``."""

    cluster: Cluster
    name: str
    namespace: str
    docs: list[Doc]

    @property
    def gateway(self) -> str:
        return f"{self.name}-modelpool-operator-gateway"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.gateway}"

    @property
    def seed(self) -> str:
        return f"{self.name}-modelpool-operator-control-seed"

    def as_gateway(self, *args: str, manifest: Doc | None = None) -> tuple[int, str]:
        done = self.cluster.kubectl(
            *args,
            f"--as={self.user}",
            input=json.dumps(manifest) if manifest is not None else None,
            check=False,
        )
        return done.returncode, done.stderr + done.stdout

    def can_i(self, *args: str) -> bool:
        done = self.cluster.kubectl("auth", "can-i", *args, f"--as={self.user}", check=False)
        answer = done.stdout.strip()
        assert answer in ("yes", "no"), answer
        return answer == "yes"

    def container(self) -> Doc:
        [deployment] = [
            d for d in self.docs if d["kind"] == "Deployment" and d["metadata"]["name"] == self.gateway
        ]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        return dict(container)


def _mine(doc: Doc, release: str, namespace: str) -> bool:
    name = doc["metadata"]["name"]
    if doc["kind"] == "Secret":
        return bool(name == f"{release}-modelpool-operator-control-seed")
    if doc["kind"] == "Namespace":
        return bool(name == default_keys_namespace(namespace))
    return doc["kind"] in APPLIED_KINDS and name.startswith(f"{release}-modelpool-operator-gateway")


@pytest.fixture
def chart_gateway(crds: Cluster, namespace: str, tmp_path: Path) -> Iterator[Callable[[Doc], Release]]:
    """A factory: ``chart_gateway(values)`` renders the chart for a fresh release in ``namespace`` and
    applies the gateway's identity, keys namespace and Lease policy and the control seed; all deleted at
    teardown."""
    made: list[tuple[Cluster, list[Doc]]] = []

    def make(values: Doc) -> Release:
        name = f"gwid-{secrets.token_hex(3)}"
        docs = render_chart(crds, name, values, tmp_path, namespace=namespace)
        applied = [d for d in docs if _mine(d, name, namespace)]
        made.append((crds, applied))
        apply_docs(crds, sorted(applied, key=lambda d: d["kind"] != "Namespace"))
        return Release(crds, name, namespace, docs)

    yield make
    for cluster, applied in made:
        delete_docs(cluster, applied)


@pytest.fixture
def pool_namespace(crds: Cluster) -> Iterator[str]:
    """A second fresh namespace: where pools are served."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    crds.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        crds.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _lease(name: str, labels: dict[str, str] | None = None) -> Doc:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 15},
    }


def _demand(pool: str) -> Doc:
    return demand_lease(
        pool=pool,
        pool_uid=None,
        moment=datetime.now(UTC),
        holder="gateway_1",
        duration_s=15,
        pool_api_version=API_VERSION,
        pool_kind=MODELPOOL_KIND,
        held=1,
    )


def test_the_gateway_may_write_only_the_pools_demand_leases(
    chart_gateway: Callable[[Doc], Release], pool_namespace: str
) -> None:
    """Its RBAC grants create/update on every Lease (RBAC cannot name objects not yet made): the policy
    refuses every Lease but a demand Lease of the project's shape, with a message that says so."""
    release = chart_gateway({})
    cluster, ns = release.cluster, pool_namespace

    def create(manifest: Doc, namespace: str = ns, *extra: str) -> tuple[int, str]:
        return release.as_gateway("create", "-n", namespace, "-f", "-", *extra, manifest=manifest)

    wait_for(
        lambda: create(_lease("probe"), ns, "--dry-run=server")[0] != 0,
        timeout=60,
        interval=0.5,
        message="the gateway's Lease policy is enforced",
    )
    # Another component's Leases (a leader election, a node's heartbeat), made by the admin: the gateway
    # can neither renew them nor make them a demand Lease.
    for name in ("kube-controller-manager", "node-demand"):
        apply(cluster, _lease(name), ns)
        taken = json.loads(cluster.kubectl("get", "lease", name, "-n", ns, "-o", "json").stdout)
        taken["spec"]["holderIdentity"] = "gateway"
        code, out = release.as_gateway("replace", "-n", ns, "-f", "-", manifest=taken)
        assert code != 0 and "may write only pools' demand Leases" in out, out
        pool = name.removesuffix("-demand")
        taken["metadata"]["labels"] = {"modelpool.dev/pool": pool, "modelpool.dev/demand": "true"}
        code, out = release.as_gateway("replace", "-n", ns, "-f", "-", manifest=taken)
        assert code != 0 and "denied request" in out, out
        if name == "node-demand":  # named like pool node's demand Lease: refused for what it was
            assert "never turn another Lease into one" in out, out
    code, out = create(_lease("kube-scheduler"))
    assert code != 0 and "may write only pools' demand Leases" in out, out
    # Shaped like a demand Lease but not named after its pool.
    misnamed = _demand("emb")
    misnamed["metadata"]["name"] = "kube-scheduler"
    code, out = create(misnamed)
    assert code != 0 and "is named emb-demand" in out, out
    # Owned by something else than its pool (the garbage collector would follow it).
    stolen = _demand("emb")
    stolen["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}]
    code, out = create(stolen)
    assert code != 0 and "owned by its ModelPool emb only" in out, out
    # Never in the release namespace (no pool is served from it).
    code, out = create(_demand("emb"), release.namespace)
    assert code != 0 and "never served from the release namespace" in out, out

    # Its job: a pool's demand Lease created by one replica and renewed by another, which adds its own
    # share (issue 31: one annotation per replica on the same Lease, so the policy's shape is unchanged).
    code, out = create(_demand("emb"))
    assert code == 0, out
    lease = json.loads(
        cluster.kubectl("get", "lease", demand_lease_name("emb"), "-n", ns, "-o", "json").stdout
    )
    lease = renew(lease, moment=datetime.now(UTC), holder="gateway_2", duration_s=15, held=2)
    code, out = release.as_gateway("replace", "-n", ns, "-f", "-", manifest=lease)
    assert code == 0, out
    renewed = json.loads(
        cluster.kubectl("get", "lease", demand_lease_name("emb"), "-n", ns, "-o", "json").stdout
    )
    demand = read_demand(renewed)
    assert demand is not None and demand.held_at(datetime.now(UTC)) == 1 + 2


def _ids(url: str, key: str) -> list[str]:
    response = httpx.get(url + "/v1/models", headers=bearer(key), timeout=5)
    assert response.status_code == 200, response.text
    return [m["id"] for m in response.json()["data"]]


def _run_gateway(release: Release, start_gateway: StartGateway, tmp_path: Path) -> GatewayProcess:
    """The real gateway as the release's ServiceAccount (its token), with the chart's args and env."""
    container = release.container()
    env = {e["name"]: e["value"] for e in container["env"]}
    flags = [a for a in container["args"] if not a.startswith(("--port", "--metrics-port"))]
    kubeconfig = token_kubeconfig(
        release.cluster, release.namespace, release.gateway, tmp_path / "gateway.kubeconfig"
    )
    return start_gateway([], *flags, kubeconfig=kubeconfig, env=env)


def test_admin_keys_live_apart_from_the_release_namespaces_secrets(
    chart_gateway: Callable[[Doc], Release],
    pool_namespace: str,
    start_gateway: StartGateway,
    tmp_path: Path,
) -> None:
    """The chart's defaults (every namespace routed): the gateway cannot list the release namespace's
    Secrets nor read the control seed; a key Secret in the keys namespace (<release namespace>-keys)
    grants every namespace through the real gateway, run as the ServiceAccount with the chart's settings."""
    release = chart_gateway({})
    cluster = release.cluster
    keys = default_keys_namespace(release.namespace)
    assert cluster.kubectl("get", "secret", release.seed, "-n", release.namespace).returncode == 0
    assert not release.can_i("list", "secrets", "-n", release.namespace)
    assert not release.can_i("get", "secrets", "-n", release.namespace)
    assert not release.can_i("list", "secrets", "--all-namespaces")
    code, out = release.as_gateway("get", "secret", release.seed, "-n", release.namespace)
    assert code != 0 and "forbidden" in out.lower(), out
    assert release.can_i("list", "secrets", "-n", keys) and release.can_i("watch", "secrets", "-n", keys)

    key = create_key(cluster, keys, "admin", namespaces=pool_namespace)
    apply(cluster, pool_manifest("served", replicas=0), pool_namespace)
    gateway = _run_gateway(release, start_gateway, tmp_path)
    wait_for(lambda: "served" in _ids(gateway.url, key), timeout=30, message="the key of the keys namespace")
    assert (
        httpx.get(gateway.url + "/v1/models", headers=bearer("not-a-key-0123456789"), timeout=5).status_code
        == 401
    )


def test_pools_of_the_release_namespace_are_never_routed_even_routing_every_namespace(
    chart_gateway: Callable[[Doc], Release],
    pool_namespace: str,
    start_gateway: StartGateway,
    tmp_path: Path,
) -> None:
    """The namespace the operator and the gateway run in holds their Secrets: a pool there (which anyone
    who may create pools there could make) is never routed, though the gateway watches every namespace and
    a key grants every namespace; the first one skipped is logged, once."""
    release = chart_gateway({})
    cluster = release.cluster
    key = create_key(cluster, default_keys_namespace(release.namespace), "admin", namespaces="*")
    apply(cluster, pool_manifest("served", replicas=0), pool_namespace)
    apply(cluster, pool_manifest("seed-reader", replicas=0), release.namespace)
    gateway = _run_gateway(release, start_gateway, tmp_path)
    wait_for(lambda: "served" in _ids(gateway.url, key), timeout=30, message="the routed namespace's pool")
    assert "seed-reader" not in _ids(gateway.url, key)
    body = {"model": f"{release.namespace}/seed-reader", "input": ["x"]}
    answer = httpx.post(gateway.url + "/v1/embeddings", json=body, headers=bearer(key), timeout=10)
    assert answer.status_code == 404, answer.text
    # One made while it runs (a watch event, not the list), then one it routes: by then both were seen.
    apply(cluster, pool_manifest("seed-reader-2", replicas=0), release.namespace)
    apply(cluster, pool_manifest("served-2", replicas=0), pool_namespace)
    wait_for(lambda: "served-2" in _ids(gateway.url, key), timeout=30, message="the second routed pool")
    assert not {"seed-reader", "seed-reader-2"} & set(_ids(gateway.url, key))
    log = gateway.log_path.read_text()
    assert log.count("never routed") == 1 and f"{release.namespace}/seed-reader" in log, log


def test_in_namespace_scope_the_gateway_reads_pods_only_where_it_routes(
    chart_gateway: Callable[[Doc], Release], namespace: str, pool_namespace: str
) -> None:
    """Namespace scope: its pods, pools and Leases are bound in the routed namespaces only; the release
    namespace, though in the gateway's own list (the operator's may not name it: the chart refuses), is
    not one (its pools are never routed)."""
    scope = {"clusterWide": False, "namespaces": [pool_namespace]}
    release = chart_gateway({"scope": scope, "gateway": {"namespaces": [namespace, pool_namespace]}})
    assert release.namespace == namespace
    assert release.can_i("list", "pods", "-n", pool_namespace)
    assert release.can_i("create", "leases.coordination.k8s.io", "-n", pool_namespace)
    for where in (["-n", namespace], ["-n", "default"], ["--all-namespaces"]):
        assert not release.can_i("list", "pods", *where), where
        assert not release.can_i("list", "modelpools.modelpool.dev", *where), where
        assert not release.can_i("create", "leases.coordination.k8s.io", *where), where
