"""The demand Lease on the real API server, written as the gateway's own identity (the chart's RBAC).

The gateway's ServiceAccount and rules come from the chart (rendered by the real helm); the API server
answers ``kubectl auth can-i`` for it and the real ``DemandRecorder`` runs with its token: it creates the
pool's Lease with an ownerReference (the local control plane enables the OwnerReferencesPermissionEnforcement
admission plugin: without ``blockOwnerDeletion`` no permission on the pool is needed), renews it, and the
garbage collector deletes it with the pool.  Two recorders that decide at once race on the Lease: the
loser's 409 (on create, then on update) makes it read again and re-apply its own share on the winner's
write, and there is one Lease with both replicas' shares (the reader sums them).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from modelpool_contract.demand import (
    DEMAND_SELECTOR,
    LEASE_PLURAL,
    demand_from_lease,
    demand_lease_name,
    read_demand,
    replica_id,
)
from modelpool_gateway.demand import DemandRecorder, LeaseClient
from modelpool_gateway.metrics import Metrics
from modelpool_gateway.state import Pool, pool_from_object
from testkit.auditlog import token_kubeconfig
from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, wait_for
from tests.operator.integration.opharness import POOLS, pool_manifest
from tests.rbacaudit import render_chart

pytestmark = [pytest.mark.cluster]

LEASES = f"{LEASE_PLURAL}.coordination.k8s.io"
IDENTITY_KINDS = {"ServiceAccount", "ClusterRole", "RoleBinding"}


@dataclass
class GatewayIdentity:
    """The chart's gateway ServiceAccount and rules, bound in one namespace; ``kubeconfig`` authenticates
    as it."""

    account: str
    kubeconfig: Path


@pytest.fixture
def identity(crds: Cluster, namespace: str, tmp_path: Path) -> Iterator[GatewayIdentity]:
    """The chart's gateway identity for a release in a namespace of its own, routing ``namespace`` (the
    gateway is bound nowhere in its release namespace: pools are never served from it)."""
    release = f"gw-{secrets.token_hex(3)}"
    home = f"{namespace}-rel"
    crds.kubectl("create", "namespace", home)
    values = {"scope": {"clusterWide": False, "namespaces": [namespace]}}
    account = f"{release}-modelpool-operator-gateway"
    docs = [
        d
        for d in render_chart(crds, release, values, tmp_path, home)
        if d["kind"] in IDENTITY_KINDS and d["metadata"]["name"] == account
    ]
    assert {d["kind"] for d in docs} == IDENTITY_KINDS, "the chart's gateway identity"
    assert [d["metadata"]["namespace"] for d in docs if d["kind"] == "RoleBinding"] == [namespace]
    for doc in docs:
        apply(crds, doc)
    try:
        yield GatewayIdentity(
            account=f"system:serviceaccount:{home}:{account}",
            kubeconfig=token_kubeconfig(crds, home, account, tmp_path / "gateway.kubeconfig"),
        )
    finally:
        crds.kubectl("delete", "clusterrole", account, "--ignore-not-found", "--wait=false")
        crds.kubectl("delete", "namespace", home, "--wait=false", check=False)


@pytest.fixture
async def api(identity: GatewayIdentity) -> AsyncIterator[client.ApiClient]:
    """An API client that authenticates as the gateway's ServiceAccount."""
    api = await config.new_client_from_config(str(identity.kubeconfig))
    try:
        yield api
    finally:
        await api.close()


def _recorder(api: client.ApiClient, pool: Pool, holder: str, held: list[bool]) -> DemandRecorder:
    return DemandRecorder(
        LeaseClient(client.CoordinationV1Api(api)),
        pools=lambda key: pool if key == pool.key else None,
        held=lambda key: len(held),
        metrics=Metrics(),
        interval_s=5,
        holder=holder,
    )


def _pool(cluster: Cluster, namespace: str, name: str) -> tuple[Pool, str]:
    """A ModelPool at zero (no operator runs here): its view and its resourceVersion."""
    manifest = pool_manifest(name, replicas=0)
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    obj = get_json(cluster, POOLS, name, "-n", namespace)
    return pool_from_object(obj), obj["metadata"]["resourceVersion"]


def _leases(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    found = get_json(cluster, LEASES, "-n", namespace, "-l", DEMAND_SELECTOR)
    return list(found["items"])


def test_the_gateways_identity_reads_pools_and_writes_leases_and_cannot_patch_a_pool(
    crds: Cluster, namespace: str, identity: GatewayIdentity
) -> None:
    def can(verb: str, resource: str) -> bool:
        answer = crds.kubectl(
            "auth", "can-i", verb, *resource.split(), "-n", namespace, "--as", identity.account, check=False
        )
        return answer.stdout.strip() == "yes"

    for verb in ("list", "watch"):
        assert can(verb, POOLS) and can(verb, "pods")
    for verb in ("get", "create", "update"):
        assert can(verb, LEASES)
    for verb in ("patch", "update", "create", "delete"):
        assert not can(verb, POOLS), f"the gateway may {verb} ModelPools"
    assert not can("patch", f"{POOLS} --subresource=status")
    # Nothing more on Leases than the recorder uses (test_gateway_rbac.py reads that from the audit log).
    for verb in ("delete", "list", "watch", "patch"):
        assert not can(verb, LEASES), f"the gateway may {verb} Leases"
    assert not can("get", "secrets")


async def test_the_recorder_creates_and_renews_the_lease_owned_by_the_pool_as_the_gateway(
    crds: Cluster, namespace: str, api: client.ApiClient
) -> None:
    pool, version = _pool(crds, namespace, "wanted")
    assert pool.uid and pool.invalid is None
    recorder = _recorder(api, pool, "gw-a", [True])
    first = datetime.now(UTC)
    assert await recorder.attempt(pool, None, first) == "written"
    [lease] = _leases(crds, namespace)
    assert lease["metadata"]["name"] == demand_lease_name("wanted")
    assert lease["metadata"]["ownerReferences"][0]["uid"] == pool.uid
    assert (demand_from_lease(lease), lease["spec"]["holderIdentity"]) == (first, "gw-a")
    # Due again an interval later: read, then updated from that read.
    later = first + timedelta(seconds=6)
    assert await recorder.attempt(pool, lease, later) == "written"
    [renewed] = _leases(crds, namespace)
    assert demand_from_lease(renewed) == later
    # Nothing was written on the pool.
    assert get_json(crds, POOLS, "wanted", "-n", namespace)["metadata"]["resourceVersion"] == version

    # The garbage collector deletes the Lease with its pool.
    crds.kubectl("delete", POOLS, "wanted", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(lambda: not _leases(crds, namespace), timeout=60, message="the Lease went with its pool")


async def test_a_409_race_between_two_recorders_ends_in_one_lease_with_both_shares(
    crds: Cluster, namespace: str, api: client.ApiClient
) -> None:
    pool, _ = _pool(crds, namespace, "raced")
    a, b = _recorder(api, pool, "gw-a", [True]), _recorder(api, pool, "gw-b", [True, True])
    now = datetime.now(UTC)

    # Both read "no Lease" and create: the second create finds it created (409).
    assert await a.attempt(pool, None, now) == "written"
    assert await b.attempt(pool, None, now + timedelta(milliseconds=5)) == "conflict"
    # b reads again at once and adds its own share to a's Lease (a's write postpones nothing of b's).
    assert await b.round(pool.key) == 5
    [lease] = _leases(crds, namespace)
    demand = read_demand(lease)
    assert demand is not None and demand.held_at(datetime.now(UTC)) == 1 + 2
    assert {s.replica for s in demand.shares} == {replica_id("gw-a"), replica_id("gw-b")}

    # Both read the same version and update it: the second update's resourceVersion is stale (409), and
    # a's write is not overwritten by b's stale copy of the Lease.
    later = datetime.now(UTC)
    assert await a.attempt(pool, lease, later) == "written"
    assert await b.attempt(pool, lease, later + timedelta(milliseconds=5)) == "conflict"
    [raced] = _leases(crds, namespace)
    assert (demand_from_lease(raced), raced["spec"]["holderIdentity"]) == (later, "gw-a")
    # b's round re-applies its share on a's write: one Lease, both replicas' latest shares.
    b.forget(pool.key)  # due at once (as after its conflict in a round)
    assert await b.round(pool.key) == 5
    [final] = _leases(crds, namespace)
    demand = read_demand(final)
    assert demand is not None and final["spec"]["holderIdentity"] == "gw-b"
    assert sorted((s.replica, s.held) for s in demand.shares) == sorted(
        [(replica_id("gw-a"), 1), (replica_id("gw-b"), 2)]
    )
    assert {s.at for s in demand.shares if s.replica == replica_id("gw-a")} == {later}
