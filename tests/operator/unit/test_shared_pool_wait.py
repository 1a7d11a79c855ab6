"""A shared pool (spec.host) while the operator does not place it: no dedicated worker, and a status that
says it waits for placement on its host, and why (``planner.shared``, ``observe.hosts``,
``reconcile_shared.shared_wait``/``refusals.host_wait_refusal``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from modelpool_contract.api import parse_host_spec, parse_pool_spec
from modelpool_contract.stats import HostStats
from modelpool_operator.bookkeeping import PoolRun
from modelpool_operator.observe.hosts import host_pod_ready, host_reports, observe_hosts
from modelpool_operator.planner.shared import (
    HOST_INVALID,
    HOST_NOT_FOUND,
    PLACED,
    PLACEMENT_PENDING,
    host_wait_event,
    host_wait_status,
    shared_wire,
)
from modelpool_operator.pool import PoolView
from modelpool_operator.reconcile_shared import shared_wait
from modelpool_operator.refusals import host_wait_refusal

NOW = datetime(2026, 11, 27, 14, 0, tzinfo=UTC)
GI = 1024**3


def shared(memory: str = "2Gi", host: str = "gpus") -> PoolView:
    spec = parse_pool_spec(
        {"model": {"source": "/m", "task": "text-embedding"}, "resources": {"memory": memory}, "host": host}
    )
    return PoolView(namespace="ns", name="emb", spec=spec, generation=2)


def pod(name: str, *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T14:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


HOST = {"gpusPerHost": 2, "deviceMemory": "8Gi", "hostMemory": "32Gi"}


def test_host_pods_are_hosts_with_the_modelhost_devices_accepting_only_while_ready() -> None:
    spec = parse_host_spec(HOST)
    hosts = observe_hosts(spec, [pod("h-1", ready=False), pod("h-0"), pod("h-2", deleting=True)])
    assert [h.name for h in hosts] == ["h-0", "h-1", "h-2"]
    assert [h.accepting for h in hosts] == [True, False, False]
    assert hosts[0].capacities == (8 * GI, 8 * GI) and hosts[0].host_memory == 32 * GI
    cpu = observe_hosts(parse_host_spec({"gpusPerHost": 0, "deviceMemory": "4Gi"}), [pod("c")])
    assert cpu[0].capacities == (4 * GI,) and cpu[0].host_memory == 0
    assert not host_pod_ready({"metadata": {}, "status": {"phase": "Pending"}})


def test_each_reason_names_the_host_and_why() -> None:
    pool = shared()
    key, pods_key = ("ns", "gpus"), ("ns", "host_gpus")
    missing = shared_wait(pool, {}, {})
    assert missing.reason == HOST_NOT_FOUND and "ModelHost gpus" in missing.message
    invalid = shared_wait(pool, {key: [{"gpusPerHost": 1}]}, {})
    assert invalid.reason == HOST_INVALID and "deviceMemory" in invalid.message
    no_pod = shared_wait(pool, {key: [HOST]}, {})
    assert no_pod.reason == "NoHost" and "waiting for placement on ModelHost gpus" in no_pod.message
    not_ready = shared_wait(pool, {key: [HOST]}, {pods_key: [pod("h-0", ready=False)]})
    assert not_ready.reason == "NoHost"
    too_big = shared_wait(shared(memory="16Gi"), {key: [HOST]}, {pods_key: [pod("h-0")]})
    assert too_big.reason == "LargerThanDevice" and "deviceMemory" in too_big.message
    room = shared_wait(pool, {key: [HOST]}, {pods_key: [pod("h-0")]})
    assert room.reason == PLACEMENT_PENDING and "h-0" in room.message
    # Another namespace's ModelHost of the same name is not this pool's.
    assert shared_wait(pool, {("other", "gpus"): [HOST]}, {}).reason == HOST_NOT_FOUND


def test_the_status_is_pending_with_no_replica_and_the_reason() -> None:
    pool = shared()
    wait = shared_wait(pool, {}, {})
    status = shared_wire(host_wait_status(pool, wait, NOW), patch=True)
    assert (status["phase"], status["replicas"], status["readyReplicas"]) == ("Pending", 0, 0)
    assert status["readyText"] == "0/1" and status["observedGeneration"] == 2
    by_type = {c["type"]: c for c in status["conditions"]}
    for kind in (PLACED, "Ready"):
        assert (by_type[kind]["status"], by_type[kind]["reason"]) == ("False", HOST_NOT_FOUND)
        assert by_type[kind]["message"] == wait.message
    assert host_wait_event(wait).type == "Warning"


def test_the_wait_is_told_once_per_reason_and_generation() -> None:
    pool, run = shared(), PoolRun(key=("ns", "emb"))
    wait = shared_wait(pool, {}, {})
    first = host_wait_refusal(run, pool, {"status": {}}, wait)
    assert first is not None and first.event.reason == HOST_NOT_FOUND
    assert host_wait_refusal(run, pool, {"status": {}}, wait) is None
    moved = shared_wait(pool, {("ns", "gpus"): [HOST]}, {})
    again = host_wait_refusal(run, pool, {"status": {}}, moved)
    assert again is not None and again.event.reason == "NoHost"


def test_a_hosts_stats_are_its_residents_under_their_pools() -> None:
    from modelpool_operator.observe.hosts import HostedPool, host_residents

    stats = {
        "host": {"devices": [{"index": 0, "capacity": 8 * GI}]},
        "models": {
            "minilm": {"state": "Ready", "memory": {"gpu_reserved_bytes": GI}, "last_request_time": 5.0},
            "gpt": {"state": "Sleeping", "queue_depth": 0, "in_flight": 1},
            "odd": {"state": "Dreaming"},
            "bad": "not a document",
        },
    }
    pools = {"minilm": HostedPool("emb", declared=2 * GI, priority=3)}
    gpt, minilm = host_residents("ns", HostStats.parse(stats), pools)
    assert (minilm.pool, minilm.state, minilm.declared, minilm.measured) == (
        ("ns", "emb"),
        "Ready",
        2 * GI,
        GI,
    )
    assert (minilm.priority, minilm.last_used, minilm.busy) == (3, 5.0, False)
    assert (gpt.pool, gpt.state, gpt.busy, gpt.measured) == (("ns", "gpt"), "Sleeping", True, None)
    assert host_residents("ns", None, pools) == ()
    assert host_residents("ns", HostStats.parse({"models": []}), pools) == ()
    [host] = observe_hosts(parse_host_spec(HOST), [pod("h-0")], host_reports({"h-0": stats}), pools)
    assert [r.pool for r in host.residents] == [("ns", "gpt"), ("ns", "emb")]


def test_the_hosted_pools_are_the_shared_pools_of_that_modelhost_by_model_name() -> None:
    from modelpool_operator.host import HostView
    from modelpool_operator.pool import OtherPool
    from modelpool_operator.reconcile_host import hosted_pools, shared_pools

    def other(name: str, host: str | None, ns: str = "ns") -> OtherPool:
        return OtherPool(ns, name, priority=1, min_replicas=0, host=host, declared=GI)

    index = {
        ("ns", "a"): [other("a", "gpus")],
        ("ns", "b"): [other("b", None)],
        ("ns", "c"): [other("c", "cpus")],
        ("x", "d"): [other("d", "gpus", ns="x")],
    }
    host = HostView(namespace="ns", name="gpus", spec=parse_host_spec(HOST))
    hosted = hosted_pools(shared_pools(host, index))
    assert list(hosted) == ["a"] and hosted["a"].name == "a" and hosted["a"].declared == GI
