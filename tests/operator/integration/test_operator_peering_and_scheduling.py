"""The operator against the real kube-scheduler (an unplaceable worker) and with two peered replicas.

Real: kube-apiserver, kube-scheduler, controller-manager, the operator's console script (two of them in the
peering tests), Kopf's peering CRDs as the chart ships them. Simulated: only the kubelet of the KWOK GPU
nodes (kwok-gpu-0..3, 8 nvidia.com/gpu each).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from modelpool_contract.times import parse_time
from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import apply, get_json, wait_established, wait_for
from tests.operator.integration.opharness import (
    POOLS,
    OperatorProcess,
    PodWatcher,
    StartOperator,
    StatusRecorder,
    WatchPods,
    condition,
    events,
    get_pool,
    pool_manifest,
    states,
    wait_status,
    worker_pods,
)

pytestmark = pytest.mark.cluster


# More GPUs than any KWOK node has (8), within the CRD's limit (spec.resources.gpus <= 16).
TOO_MANY_GPUS = 12
# Short, but long enough that the first passes see the pod unplaced *before* the timeout: they must say
# "Scheduling", not "Unschedulable", which is what shows the timeout is applied at all.
UNSCHEDULABLE_TIMEOUT_S = 5


def _pod_scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            return dict(cond)
    return {}


def test_unplaceable_worker_is_reported_unschedulable_then_converges_once_fixed(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    recorder = StatusRecorder(cluster, namespace).start()
    try:
        start_operator(
            namespace,
            MODELPOOL_OPERATOR_UNSCHEDULABLE_TIMEOUT_SECONDS=str(UNSCHEDULABLE_TIMEOUT_S),
            # Every status change written at once: the test reads the one before the timeout ran out,
            # which a creation's paced status (5 s, as long as this timeout) may skip.
            MODELPOOL_OPERATOR_CREATING_STATUS_INTERVAL_SECONDS="0",
        )
        manifest = pool_manifest("big", replicas=1, memory="1Gi")
        manifest["spec"]["resources"]["gpus"] = TOO_MANY_GPUS
        apply(cluster, manifest, namespace)

        # The real scheduler's verdict on the pod: Pending, PodScheduled=False/Unschedulable.
        def unplaced() -> dict[str, Any] | None:
            pods = worker_pods(cluster, namespace, "big")
            if len(pods) == 1 and _pod_scheduled(pods[0]).get("reason") == "Unschedulable":
                return pods[0]
            return None

        pod = wait_for(
            unplaced, timeout=30, interval=0.3, message="the scheduler marks the worker unschedulable"
        )
        assert pod["status"]["phase"] == "Pending"
        assert not pod["spec"].get("nodeName")
        assert pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == str(TOO_MANY_GPUS)
        scheduled = _pod_scheduled(pod)
        assert scheduled["status"] == "False"
        assert "nvidia.com/gpu" in scheduled["message"], scheduled

        status = wait_status(
            cluster,
            namespace,
            "big",
            lambda s: any(w.get("reason") == "Unschedulable" for w in s.get("workers") or []),
            timeout=30,
            message="the worker reported Unschedulable after the timeout",
        )
        [worker] = status["workers"]
        assert worker["name"] == pod["metadata"]["name"]
        assert worker["state"] == "Pending"
        # The scheduler's own message, passed through (e.g. "0/5 nodes are available: 4 Insufficient
        # nvidia.com/gpu, ...").
        current = _pod_scheduled(worker_pods(cluster, namespace, "big")[0])
        assert worker["message"] == current["message"], (worker, current)
        assert "Insufficient nvidia.com/gpu" in worker["message"]
        assert status["phase"] == "Pending"
        assert status["readyReplicas"] == 0
        degraded = condition(status, "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "Unschedulable")
        assert worker["name"] in degraded["message"] and worker["message"] in degraded["message"]
        ready = condition(status, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "WorkersNotReady")

        # The timeout is honoured: before it ran out, the same unplaced pod was reported as still being
        # scheduled (the scheduler had long said Unschedulable by then: a retry may still place a pod).
        seen = [
            w for s in recorder.statuses("big") for w in s.get("workers") or [] if w["name"] == worker["name"]
        ]
        assert any(w["state"] == "Pending" and w.get("reason") == "Scheduling" for w in seen), seen

        warning = wait_for(
            lambda: [
                e
                for e in events(cluster, namespace, "big")
                if e["reason"] == "Unschedulable" and e["involvedObject"]["kind"] == "ModelPool"
            ],
            timeout=15,
            message="a Warning Event Unschedulable on the pool",
        )
        assert warning[0]["type"] == "Warning"
        assert worker["name"] in warning[0]["message"]
        assert "Insufficient nvidia.com/gpu" in warning[0]["message"]

        # Fix the pool: one GPU per worker fits every KWOK node. The spec change rolls the worker over; the
        # unplaceable one (never started) is deleted at once and a placeable one replaces it.
        cluster.kubectl(
            "patch", POOLS, "big", "-n", namespace, "--type=merge", "-p", '{"spec":{"resources":{"gpus":1}}}'
        )
        status = wait_status(
            cluster,
            namespace,
            "big",
            lambda s: states(s) == ["Ready"] and s.get("readyReplicas") == 1,
            timeout=60,
            message="the fixed pool converges to one Ready worker",
        )
    finally:
        recorder.stop()
    [fixed] = status["workers"]
    assert fixed["name"] != worker["name"]
    assert fixed["node"].startswith("kwok-gpu-")
    assert fixed.get("reason") in (None, "")
    assert status["phase"] == "Ready"
    assert condition(status, "Degraded")["status"] == "False"
    assert condition(status, "Ready")["status"] == "True"
    wait_for(
        lambda: [p["metadata"]["name"] for p in worker_pods(cluster, namespace, "big")] == [fixed["name"]],
        timeout=30,
        interval=0.5,
        message="only the fixed worker's pod is left",
    )
    assert _pod_scheduled(worker_pods(cluster, namespace, "big")[0])["status"] == "True"


# ---- two operator replicas in one Kopf peering ------------------------------------------------------------

PEERINGS = "kopfpeerings.kopf.dev"
PEERING = "modelpool-test"
# A peer silent this long counts as gone (Kopf's default is 60 s): how long a SIGKILLed replica blocks the
# other one. Its keep-alives come every max(1, lifetime - 5..10) s, i.e. every second here.
LIFETIME_S = 6
# What an operator that acts on pools logs (Kopf, --verbose); a paused one logs none of it.
ACTING = ("Daemon 'pool_daemon' is invoked", "Handler 'pool_changed' is invoked")
RESUMED = "Resuming operations after the pause"


@pytest.fixture(scope="session")
def peering_crds(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    """Kopf's KopfPeering/ClusterKopfPeering CRDs exactly as the chart ships them (rendered by bin/helm)."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        **{f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")},
    }
    rendered = subprocess.run(
        [
            str(crds.bin_dir / "helm"),
            "template",
            "mp",
            str(ROOT / "charts" / "modelpool-operator"),
            "--show-only",
            "templates/peering-crds.yaml",
            # Off by default since leader election (kept one release): rendered when asked for.
            "--set",
            "peering.enabled=true",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "kind: KopfPeering" in rendered, rendered
    crds.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=rendered)
    wait_established(crds, "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev")
    return crds


def _peers(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    """The peering object's status: identity -> {priority, lifetime, lastseen}, as the operators wrote it."""
    status: dict[str, dict[str, Any]] = (
        get_json(cluster, PEERINGS, PEERING, "-n", namespace).get("status") or {}
    )
    return status


def _deadline(peer: dict[str, Any]) -> datetime:
    lastseen = parse_time(peer["lastseen"])
    assert lastseen is not None
    return lastseen + timedelta(seconds=int(peer["lifetime"]))


def _created(pod: dict[str, Any]) -> datetime:
    created = parse_time(pod["metadata"]["creationTimestamp"])
    assert created is not None
    return created


def _acted(process: OperatorProcess) -> bool:
    log = process.log_tail(10**8)
    return any(marker in log for marker in ACTING)


def _names_created(watcher: PodWatcher, pool: str) -> set[str]:
    return {name for _, kind, name, _ in watcher.history if kind == "ADDED" and name.startswith(f"{pool}-")}


def _create_peering(cluster: Cluster, namespace: str) -> None:
    """The namespaced KopfPeering object that ``--peering NAME`` requires (the chart creates it too)."""
    apply(
        cluster,
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}},
        namespace,
    )


def _wait_ready_workers(
    cluster: Cluster, namespace: str, pool: str, replicas: int, message: str
) -> list[Any]:
    """Wait until the pool shows ``replicas`` Ready workers, give the operator a few more passes, and
    return the pool's worker pods."""
    wait_status(
        cluster,
        namespace,
        pool,
        lambda s: states(s) == ["Ready"] * replicas and s.get("readyReplicas") == replicas,
        timeout=60,
        message=message,
    )
    time.sleep(2)  # a few more passes: still exactly these workers
    return worker_pods(cluster, namespace, pool)


def _assert_created_exactly(watcher: PodWatcher, pool: str, pods: list[Any], replicas: int) -> None:
    """No worker was ever created beyond the ones that exist, and never more than ``replicas`` at once."""
    assert len(pods) == replicas
    assert _names_created(watcher, pool) == {p["metadata"]["name"] for p in pods}
    assert watcher.max_pods.get(pool) == replicas, watcher.max_pods


@dataclass
class Peers:
    """Peered operator replicas in the test's namespace, with a pod watcher on it."""

    cluster: Cluster
    namespace: str
    start_operator: StartOperator
    watcher: PodWatcher

    def start(self, identity: str, **env: str) -> OperatorProcess:
        # POD_ID is Kopf's own way to name a peer (as a pod's name would): the test then finds each process
        # in the peering object.
        return self.start_operator(
            self.namespace,
            peering=PEERING,
            POD_ID=identity,
            MODELPOOL_OPERATOR_PEERING_LIFETIME_SECONDS=str(LIFETIME_S),
            **env,
        )

    def start_alone(self, identity: str, message: str, **env: str) -> OperatorProcess:
        """Start the first replica and wait until it acts: alone in the peering, it resumes (a peered
        operator starts paused until it has seen the peers)."""
        process = self.start(identity, **env)
        wait_for(lambda: RESUMED in process.log_tail(10**8), timeout=30, message=message)
        return process


@pytest.fixture
def peers(
    peering_crds: Cluster, namespace: str, start_operator: StartOperator, watch_pods: WatchPods
) -> Peers:
    """The set-up the peering tests share: the KopfPeering object and a pod watcher, before any replica."""
    _create_peering(peering_crds, namespace)
    return Peers(peering_crds, namespace, start_operator, watch_pods())


def test_peered_replicas_only_the_highest_priority_acts_and_the_standby_takes_over(peers: Peers) -> None:
    cluster, namespace, watcher = peers.cluster, peers.namespace, peers.watcher
    try:
        processes = {
            "op-high": peers.start_alone(
                "op-high", "op-high active", MODELPOOL_OPERATOR_PEERING_PRIORITY="20"
            )
        }
        # The standby joins a peering where a higher-priority peer is alive: it starts paused and stays so.
        # (What Kopf guarantees: a mandatory peer starts paused and acts only after seeing no live peer of
        # higher or equal priority. It has no lock, so two peers started at the same instant could each see
        # only themselves for a moment; a replica joining a live peering, as here, never acts.)
        processes["op-low"] = peers.start("op-low", MODELPOOL_OPERATOR_PEERING_PRIORITY="10")

        def both_announced() -> dict[str, dict[str, Any]] | None:
            listed = _peers(cluster, namespace)
            return listed if set(listed) == {"op-high", "op-low"} else None

        seen = wait_for(both_announced, timeout=30, message="both replicas announced in the peering object")
        assert {k: v["priority"] for k, v in seen.items()} == {"op-high": 20, "op-low": 10}
        assert {v["lifetime"] for v in seen.values()} == {LIFETIME_S}

        apply(cluster, pool_manifest("peered", replicas=3), namespace)
        wait_status(
            cluster,
            namespace,
            "peered",
            lambda s: states(s) == ["Ready"] * 3 and s.get("readyReplicas") == 3,
            timeout=60,
            message="3 Ready workers",
        )
        time.sleep(2)  # a few more passes: still exactly the three workers
        first_three = {p["metadata"]["name"] for p in worker_pods(cluster, namespace, "peered")}
        assert len(first_three) == 3
        assert _names_created(watcher, "peered") == first_three
        assert watcher.max_pods.get("peered") == 3, watcher.max_pods
        # Only the active replica handled anything; the standby never did.
        assert _acted(processes["op-high"])
        assert not _acted(processes["op-low"]), processes["op-low"].log_tail()
        assert RESUMED not in processes["op-low"].log_tail(10**8)

        # The active replica, as the peering object says: the live peer with the highest priority.
        now = datetime.now(UTC)
        live = {k: v for k, v in _peers(cluster, namespace).items() if _deadline(v) > now}
        active = max(live, key=lambda k: int(live[k]["priority"]))
        assert active == "op-high"
        processes[
            active
        ].kill()  # SIGKILL: no goodbye in the peering object, its record stays until it expires
        dead = _peers(cluster, namespace)[active]
        survivor = processes["op-low"]
        cluster.kubectl(
            "patch", POOLS, "peered", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":5}}'
        )

        wait_for(
            lambda: RESUMED in survivor.log_tail(10**8), timeout=LIFETIME_S + 20, message="op-low resumes"
        )
        pods = _wait_ready_workers(
            cluster, namespace, "peered", 5, "the standby converges the pool to 5 Ready workers"
        )
    finally:
        watcher.stop()
    assert _acted(survivor)
    pool = get_pool(cluster, namespace, "peered")
    assert pool["status"]["observedGeneration"] == pool["metadata"]["generation"]
    # Worker names are deterministic (<pool>-<hash>-<n>), so a second actor would show as extra pods at
    # once (max_pods) or as a name beyond the five, not as a duplicate name.
    # Exactly 5 pods were ever created: the standby adopted the three it found and added two.
    _assert_created_exactly(watcher, "peered", pods, 5)
    # The standby acted only once the dead replica's record had expired (Kopf's guarantee; whole seconds on
    # the pods' timestamps, hence the one second).
    first_new = min(_created(p) for p in pods if p["metadata"]["name"] not in first_three)
    assert first_new >= _deadline(dead) - timedelta(seconds=1), (first_new, dead)
    # The survivor removed the dead peer's record (Kopf's autoclean) and keeps announcing itself.
    assert set(_peers(cluster, namespace)) == {"op-low"}


def test_peered_replicas_of_equal_priority_all_pause_until_one_is_gone(peers: Peers) -> None:
    # Kopf's rule for equal priorities: every peer of the same (highest) priority pauses, none acts, until
    # only one is left. "Never act at once" holds by nobody acting. This is why the operator draws a random
    # priority when none is configured (replicas of one Deployment share their settings): see the next test.
    cluster, namespace, watcher = peers.cluster, peers.namespace, peers.watcher
    try:
        first = peers.start_alone("op-a", "op-a active while alone", MODELPOOL_OPERATOR_PEERING_PRIORITY="10")
        second = peers.start("op-b", MODELPOOL_OPERATOR_PEERING_PRIORITY="10")
        wait_for(
            lambda: "Pausing all operators, including self" in first.log_tail(10**8),
            timeout=30,
            message="op-a pauses when an equal-priority peer appears",
        )
        wait_for(
            lambda: "Possibly conflicting operators with the same priority" in second.log_tail(10**8),
            timeout=30,
            message="op-b sees op-a and stays paused",
        )

        apply(cluster, pool_manifest("frozen", replicas=2), namespace)
        # A resync interval (3 s) and more: an acting operator would have added its finalizer, written a
        # status and created both workers within a second.
        time.sleep(5)
        pool = get_pool(cluster, namespace, "frozen")
        assert not pool.get("status"), pool.get("status")
        assert not pool["metadata"].get("finalizers"), pool["metadata"]
        assert not worker_pods(cluster, namespace, "frozen")
        assert not _acted(first) and not _acted(second)

        second.kill()  # SIGKILL: op-a may act once op-b's record expires
        dead = _peers(cluster, namespace)["op-b"]
        wait_for(
            lambda: first.log_tail(10**8).count(RESUMED) >= 2, timeout=LIFETIME_S + 20, message="op-a resumes"
        )
        pods = _wait_ready_workers(
            cluster, namespace, "frozen", 2, "the survivor converges the pool to 2 Ready workers"
        )
    finally:
        watcher.stop()
    _assert_created_exactly(watcher, "frozen", pods, 2)
    first_created = min(_created(p) for p in pods)
    assert first_created >= _deadline(dead) - timedelta(seconds=1), (first_created, dead)


def test_peered_replicas_with_the_same_settings_elect_one_active_replica(peers: Peers) -> None:
    # As the chart runs replicas: identical settings, no priority configured. Each draws its own random
    # priority, so exactly one acts and the other stands by.
    cluster, namespace, watcher = peers.cluster, peers.namespace, peers.watcher
    try:
        processes = {"op-1": peers.start_alone("op-1", "op-1 acts")}
        processes["op-2"] = peers.start("op-2")

        def both_announced() -> dict[str, dict[str, Any]] | None:
            listed = _peers(cluster, namespace)
            return listed if set(listed) == {"op-1", "op-2"} else None

        seen = wait_for(both_announced, timeout=30, message="both replicas announced in the peering object")
        priorities = {k: int(v["priority"]) for k, v in seen.items()}
        assert priorities["op-1"] != priorities["op-2"], priorities
        active = max(priorities, key=lambda k: priorities[k])
        standby = "op-1" if active == "op-2" else "op-2"
        # Settle the election before there is work: the active one runs, the other has paused (op-1 was
        # running alone, so if it drew the lower priority it must say it pauses in favour of op-2).
        wait_for(lambda: RESUMED in processes[active].log_tail(10**8), timeout=30, message=f"{active} acts")
        if standby == "op-1":
            wait_for(
                lambda: "Pausing operations in favour of" in processes["op-1"].log_tail(10**8),
                timeout=30,
                message="op-1 pauses in favour of op-2",
            )
        apply(cluster, pool_manifest("elected", replicas=2), namespace)
        pods = _wait_ready_workers(cluster, namespace, "elected", 2, "2 Ready workers")
    finally:
        watcher.stop()
    _assert_created_exactly(watcher, "elected", pods, 2)
    assert _acted(processes[active]) and not _acted(processes[standby])
