"""The operator on the local real control plane, with worker pods on KWOK GPU nodes (docs/design.md).

Real: kube-apiserver, scheduler, controller-manager (garbage collection), kubectl, the operator's console
script. Simulated: the kubelet of the kwok-gpu-* nodes (pods become Running/Ready; the chaos labels make
them die like OOMKilled or load-failed servers). No server answers /stats on KWOK pods, so their stats
stay unknown: that must never fail them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from modelpool_contract.times import parse_time
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, get_json, wait_for
from tests.operator.integration.opharness import (
    GI,
    POOLS,
    BudgetedOperator,
    StartOperator,
    StatusRecorder,
    WatchPods,
    condition,
    events,
    pool_manifest,
    pool_status,
    states,
    wait_pods_gone,
    wait_status,
    worker_pods,
)

pytestmark = pytest.mark.cluster


def _scale(cluster: Cluster, namespace: str, name: str, replicas: int) -> None:
    cluster.kubectl(
        "patch",
        POOLS,
        name,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        f'{{"spec":{{"replicas":{replicas}}}}}',
    )


def test_pool_gets_workers_states_service_and_scales(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    start_operator(namespace)
    apply(cluster, pool_manifest("emb", replicas=2, memory="2Gi"), namespace)

    status = wait_status(
        cluster,
        namespace,
        "emb",
        lambda s: states(s) == ["Ready", "Ready"] and s.get("readyReplicas") == 2,
        timeout=60,
        message="two Ready workers in status",
    )
    assert status["phase"] == "Ready"
    assert status["memory"]["chargedBytes"] == 4 * GI
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "BudgetExceeded")["status"] == "False"
    for worker in status["workers"]:
        assert worker["node"].startswith("kwok-gpu-")
        assert worker["memory"] == "2Gi"
        assert worker.get("queueDepth") is None  # stats unknown on KWOK: not a failure
    pods = worker_pods(cluster, namespace, "emb")
    assert {p["metadata"]["name"] for p in pods} == {w["name"] for w in status["workers"]}
    owner = pods[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("ModelPool", "emb", True)
    service = get_json(cluster, "service", "emb", "-n", namespace)
    assert service["spec"]["selector"] == {"modelpool.dev/pool": "emb", "modelpool.dev/serving": "true"}
    assert service["spec"]["clusterIP"] == "None"  # headless: no address taken from the Service IP range

    _scale(cluster, namespace, "emb", 3)
    wait_status(
        cluster, namespace, "emb", lambda s: states(s) == ["Ready"] * 3, timeout=60, message="scaled up to 3"
    )
    _scale(cluster, namespace, "emb", 1)
    wait_for(
        lambda: len(worker_pods(cluster, namespace, "emb")) == 1,
        timeout=60,
        interval=0.5,
        message="scaled down to one pod",
    )
    status = wait_status(
        cluster,
        namespace,
        "emb",
        lambda s: states(s) == ["Ready"],
        timeout=30,
        message="one worker in status",
    )
    assert status["memory"]["chargedBytes"] == 2 * GI
    reasons = {e["reason"] for e in events(cluster, namespace, "emb")}
    assert {"CreatingWorker", "WorkerReady"} <= reasons, reasons


def test_load_failure_is_reported_released_and_replaced_with_backoff(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    recorder = StatusRecorder(cluster, namespace).start()
    start_operator(namespace)
    message = "model weights missing: /models/tiny/model.safetensors"
    pool = pool_manifest(
        "broken",
        memory="3Gi",
        labels={"kwok.modelpool.test/chaos": "load-failed"},
        annotations={"kwok.modelpool.test/chaos-message": message},
    )
    apply(cluster, pool, namespace)
    first_uid = set(
        wait_for(
            lambda: {p["metadata"]["uid"] for p in worker_pods(cluster, namespace, "broken")},
            timeout=60,
            message="the first worker pod",
        )
    )

    def failed_status() -> dict[str, Any] | None:
        for status in recorder.statuses("broken"):
            if any(w["state"] == "Failed" for w in status.get("workers") or []):
                return status
        return None

    try:
        failed = wait_for(failed_status, timeout=60, message="a Failed worker in status")
    finally:
        recorder.stop()
    worker = next(w for w in failed["workers"] if w["state"] == "Failed")
    assert worker["reason"] == "LoadFailed"
    assert message in (worker["message"] or "")
    assert worker["memory"] == "0"  # a failed worker is charged nothing, from the moment it is seen failed
    assert failed["memory"]["chargedBytes"] == 0
    assert condition(failed, "Degraded")["reason"] == "LoadFailed"

    # Deleted, and replaced once the per-pool backoff (surfaced in status, on the pass that saw it fail).
    assert failed["backoff"]["failures"] >= 1
    not_before = parse_time(failed["backoff"]["nextAttemptAfter"])

    def replacements() -> list[dict[str, Any]]:
        return [p for p in worker_pods(cluster, namespace, "broken") if p["metadata"]["uid"] not in first_uid]

    new_pods = wait_for(replacements, timeout=60, interval=0.5, message="the failed worker replaced")
    created = min(parse_time(p["metadata"]["creationTimestamp"]) for p in new_pods)  # type: ignore[type-var]
    assert created is not None and not_before is not None
    # Kubernetes timestamps have whole seconds: allow one second of rounding.
    assert created >= not_before - timedelta(seconds=1), (created, not_before)
    found = events(cluster, namespace, "broken")
    assert any(e["reason"] == "LoadFailed" and message in e["message"] for e in found), found
    assert any(e["reason"] == "BackOff" for e in found)


def test_oom_killed_worker_is_failed_with_reason(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    start_operator(namespace)
    apply(cluster, pool_manifest("oom", memory="1Gi", labels={"kwok.modelpool.test/chaos": "oom"}), namespace)
    status = wait_status(
        cluster,
        namespace,
        "oom",
        lambda s: any(w["state"] == "Failed" and w["reason"] == "OOMKilled" for w in s.get("workers") or []),
        timeout=60,
        message="an OOMKilled worker",
    )
    assert status["memory"]["chargedBytes"] == 0
    assert any(e["reason"] == "OOMKilled" for e in events(cluster, namespace, "oom"))


def test_two_pools_contending_for_a_small_budget_never_over_admit(
    cluster: Cluster, namespace: str, budgeted_operator: BudgetedOperator
) -> None:
    watcher, _ = budgeted_operator("5Gi")
    try:
        apply(cluster, pool_manifest("a", replicas=3, memory="2Gi"), namespace)
        apply(cluster, pool_manifest("b", replicas=3, memory="2Gi"), namespace)

        # Two 2Gi workers fit into 5Gi, a third never does.
        def settled() -> bool:
            a, b = pool_status(cluster, namespace, "a"), pool_status(cluster, namespace, "b")
            ready = (a.get("readyReplicas") or 0) + (b.get("readyReplicas") or 0)
            blocked = [condition(s, "BudgetExceeded").get("status") for s in (a, b)]
            return ready == 2 and blocked == ["True", "True"]

        wait_for(settled, timeout=60, interval=0.5, message="two workers admitted, both pools blocked")
        time.sleep(3)  # a few more passes of both pools: still nothing more admitted
        assert (
            sum(1 for p in worker_pods(cluster, namespace, "a") + worker_pods(cluster, namespace, "b")) == 2
        )
        blocked = condition(pool_status(cluster, namespace, "a"), "BudgetExceeded")
        assert blocked["reason"] == "InsufficientMemory"
        assert "2Gi" in blocked["message"] or "2.0 GiB" in blocked["message"], blocked["message"]
        mb = get_json(cluster, "modelbudget", "default")
        assert mb["status"]["usedBytes"] == 4 * GI
        shares = {p["name"]: p["memoryBytes"] for p in mb["status"]["pools"]}
        assert sum(shares.values()) == 4 * GI

        # Memory freed (pool a deleted) -> pool b gets it, driven by the pod events.
        cluster.kubectl("delete", POOLS, "a", "-n", namespace, "--wait=false")
        wait_status(
            cluster,
            namespace,
            "b",
            lambda s: s.get("readyReplicas") == 2 and condition(s, "BudgetExceeded").get("status") == "True",
            timeout=60,
            message="pool b takes the freed memory, up to the budget",
        )
    finally:
        watcher.stop()
    assert watcher.max_memory <= 5 * GI, f"over-admitted: {watcher.max_memory / GI:.1f} GiB at once"


def test_spec_change_rolls_workers_over_keeping_them_ready(
    cluster: Cluster, namespace: str, start_operator: StartOperator, watch_pods: WatchPods
) -> None:
    start_operator(namespace)
    apply(cluster, pool_manifest("roll", replicas=2, min_replicas=1), namespace)
    wait_status(
        cluster, namespace, "roll", lambda s: states(s) == ["Ready", "Ready"], timeout=60, message="2 ready"
    )
    old_hashes = {
        p["metadata"]["labels"]["modelpool.dev/template-hash"]
        for p in worker_pods(cluster, namespace, "roll")
    }
    watcher = watch_pods()
    try:
        wait_for(lambda: len(watcher.pods) == 2, timeout=15, message="watcher synced")
        watcher.arm_ready_floor("roll", 2)
        cluster.kubectl(
            "patch",
            POOLS,
            "roll",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"spec":{"queue":{"capacity":7}}}',
        )

        def rolled() -> bool:
            pods = [
                p
                for p in worker_pods(cluster, namespace, "roll")
                if not p["metadata"].get("deletionTimestamp")
            ]
            hashes = {p["metadata"]["labels"]["modelpool.dev/template-hash"] for p in pods}
            return len(pods) == 2 and not hashes & old_hashes

        wait_for(rolled, timeout=90, interval=0.5, message="both workers rolled over to the new spec")
    finally:
        watcher.stop()
    assert watcher.min_ready_after["roll"] >= 2, "the roll-over dropped below the ready target"
    pod = worker_pods(cluster, namespace, "roll")[0]
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--queue-capacity") + 1] == "7"


def test_a_new_default_server_image_rolls_the_workers_one_at_a_time_within_the_budget(
    cluster: Cluster, namespace: str, start_operator: StartOperator, budgeted_operator: BudgetedOperator
) -> None:
    """Issue 31 item 4: the template hash covers what the operator adds (here the server image it defaults
    to), so an operator upgraded to a new image rolls every pool to it, one worker at a time, keeping the
    ready count, under a budget with room for one surge worker only."""
    old, new = (f"ghcr.io/modelpool/modelpool-server:{tag}" for tag in ("1.0.0", "1.1.0"))
    # Both operators pass the workers the same probe port: only the image they default to differs.
    port = str(free_port())
    env = {"MODELPOOL_OPERATOR_SERVER_PROBE_PORT": port}
    watcher, first = budgeted_operator("3Gi", MODELPOOL_OPERATOR_SERVER_IMAGE=old, **env)
    try:
        apply(cluster, pool_manifest("img", replicas=2, min_replicas=1, memory="1Gi"), namespace)
        wait_status(
            cluster,
            namespace,
            "img",
            lambda s: states(s) == ["Ready", "Ready"],
            timeout=60,
            message="2 ready",
        )
        assert first.stop() == 0
        watcher.arm_ready_floor("img", 2)
        start_operator(namespace, MODELPOOL_OPERATOR_SERVER_IMAGE=new, **env)

        def images() -> list[str]:
            live = [
                p
                for p in worker_pods(cluster, namespace, "img")
                if not p["metadata"].get("deletionTimestamp")
            ]
            return sorted(p["spec"]["containers"][0]["image"] for p in live)

        wait_for(
            lambda: images() == [new, new], timeout=90, interval=0.5, message="both workers on the new image"
        )
    finally:
        watcher.stop()
    assert watcher.min_ready_after["img"] >= 2, "the roll dropped below the ready count"
    assert watcher.max_pods["img"] <= 3, "more than one surge worker at once"
    assert watcher.max_memory <= 3 * GI, f"over the budget: {watcher.max_memory / GI:.1f} GiB at once"


def test_pool_deletion_cascades_to_pods_and_service(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    start_operator(namespace)
    apply(cluster, pool_manifest("gone", replicas=2), namespace)
    wait_status(
        cluster, namespace, "gone", lambda s: states(s) == ["Ready", "Ready"], timeout=60, message="2 ready"
    )
    cluster.kubectl("delete", POOLS, "gone", "-n", namespace, "--timeout=60s")
    wait_pods_gone(cluster, namespace, "gone")
    wait_for(
        lambda: cluster.kubectl("get", "service", "gone", "-n", namespace, check=False).returncode != 0,
        timeout=60,
        interval=0.5,
        message="service garbage-collected",
    )


def test_operator_killed_mid_scale_up_converges_without_duplicates(
    cluster: Cluster,
    namespace: str,
    start_operator: StartOperator,
    budget: Callable[[str], None],
    budgeted_operator: BudgetedOperator,
) -> None:
    # The budget holds the scale-up half-way, so the kill lands in its middle deterministically.
    watcher, first = budgeted_operator("4Gi")
    try:
        apply(cluster, pool_manifest("big", replicas=8, memory="1Gi"), namespace)
        wait_status(
            cluster,
            namespace,
            "big",
            lambda s: s.get("readyReplicas") == 4 and condition(s, "BudgetExceeded").get("status") == "True",
            timeout=60,
            message="half of the scale-up done, the rest waiting for budget",
        )
        first.kill()  # SIGKILL: no cleanup, in-memory reservations lost
        budget("8Gi")  # room for the rest, while no operator runs
        start_operator(namespace)
        wait_status(
            cluster,
            namespace,
            "big",
            lambda s: s.get("readyReplicas") == 8,
            timeout=90,
            message="converged to 8 ready workers after the restart",
        )
        time.sleep(2)
        pods = worker_pods(cluster, namespace, "big")
        assert len(pods) == 8
    finally:
        watcher.stop()
    assert watcher.max_pods.get("big", 0) == 8, f"at most 8 workers at any time, saw {watcher.max_pods}"
