"""Autoscaling and waking from zero with real ``modelpool-server`` workers on the process node
(docs/operator.md, "Autoscaling").

The workers run the echo embedding handler of ``testkit/echo_models.py`` with a slow forward pass and
batches of one, so a few concurrent clients build up in-flight and queued requests, which the workers
report in ``/stats``.  The load goes straight to the workers' pod IPs (the way the pool's Service
routes); the demand a gateway would record is written the way a gateway writes it, as the pool's demand
Lease (``modelpool_contract.demand``).  A pod watcher records every pod change
from before the operator starts, so "never more than maxReplicas" is checked at every instant.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from modelpool_contract.api import API_VERSION, MODELPOOL_KIND
from modelpool_contract.demand import demand_lease
from modelpool_contract.times import parse_time, rfc3339_ms
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.load import ClosedLoop
from testkit.services import echo_pool
from tests.operator.integration.opharness import (
    POOLS,
    BudgetedOperator,
    PodWatcher,
    condition,
    reasons,
    wait_at_zero,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CLIENTS = 12


def slow_echo_pool(
    name: str, *, run_seconds: float, autoscaling: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    """Echo-embedding workers on the process node whose forward pass takes ``run_seconds``: one request
    per forward pass."""
    env = {"HANDLER_RUN_SECONDS": str(run_seconds)}
    return echo_pool(name, env=env, autoscaling=autoscaling, max_batch_size=1, **kw)


def serving_ips(watcher: PodWatcher, pool: str) -> list[str]:
    """The pod IPs of the pool's ready, serving workers, as the watcher last saw them."""
    return sorted(
        p["status"]["podIP"]
        for p in watcher.snapshot()
        if p["metadata"]["labels"].get("modelpool.dev/pool") == pool
        and p["metadata"]["labels"].get("modelpool.dev/serving") == "true"
        and not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("podIP")
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in p["status"].get("conditions") or []
        )
    )


def to_workers(watcher: PodWatcher, pool: str, port: int) -> Callable[[int], str | None]:
    """Requests spread over the pool's serving workers, round robin (the way the pool's Service routes)."""

    def target(n: int) -> str | None:
        ips = serving_ips(watcher, pool)
        return f"http://{ips[n % len(ips)]}:{port}" if ips else None

    return target


def test_load_scales_up_to_max_replicas_never_past_it_and_back_down_after_the_delay(
    cluster: Cluster, namespace: str, budgeted_operator: BudgetedOperator
) -> None:
    port = free_port()
    watcher, _ = budgeted_operator("16Gi", MODELPOOL_OPERATOR_SERVER_PORT=str(port))
    policy = {
        "targetPerWorker": 2,
        "scaleUpWindowSeconds": 2,
        "stableWindowSeconds": 4,
        "scaleDownDelaySeconds": 6,
    }
    manifest = slow_echo_pool(
        "auto", run_seconds=0.2, autoscaling=policy, replicas=1, min_replicas=1, max_replicas=3
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    wait_status(
        cluster,
        namespace,
        "auto",
        lambda s: s.get("readyReplicas") == 1,
        timeout=180,
        message="the first worker Ready",
    )
    load = ClosedLoop(to_workers(watcher, "auto", port), "auto", CLIENTS).start()
    try:
        # 12 requests outstanding at 2 per worker ask for 6 workers: the pool goes to maxReplicas (3).
        scaled_up = wait_status(
            cluster,
            namespace,
            "auto",
            lambda s: s.get("readyReplicas") == 3,
            timeout=180,
            message="scaled up to maxReplicas, every worker Ready",
        )
        assert scaled_up["targetReplicas"] == 3 and scaled_up["autoscaling"]["desiredReplicas"] == 3
        assert (scaled_up["autoscaling"]["observedLoad"] or 0) > 0
        assert load.answered > 0
    finally:
        calm_since = datetime.now(UTC)
        load.stop()

    # Calm: after scaleDownDelaySeconds of lower load the pool goes back to one worker (minReplicas).
    calm = wait_status(
        cluster,
        namespace,
        "auto",
        lambda s: s.get("targetReplicas") == 1 and len(s.get("workers") or []) == 1,
        timeout=120,
        message="scaled back down to one worker",
    )
    assert calm["phase"] in ("Ready", "Idle")
    last_scale = parse_time(calm["autoscaling"]["lastScaleTime"])
    assert last_scale is not None
    # lastScaleTime is to the second: the scale-down came no sooner than the delay after the load ended.
    assert (last_scale - calm_since).total_seconds() >= policy["scaleDownDelaySeconds"] - 1
    scaled = [(r, m) for r, m in reasons(cluster, namespace, "auto") if r in ("ScaledUp", "ScaledDown")]
    assert any(r == "ScaledUp" and m.endswith("-> 3 workers") for r, m in scaled), scaled
    # Down in one step, or two when the stable window still held some load as the countdown began (each
    # step goes to the most workers the load asked for during its delay).
    downs = [m for r, m in scaled if r == "ScaledDown"]
    assert downs and any(m.endswith("3 -> 1 workers") or m.endswith("3 -> 2 workers") for m in downs), scaled
    assert any(m.endswith("-> 1 workers") for m in downs), scaled
    watcher.stop()
    assert watcher.max_pods["auto"] == 3, f"worker pods at once: {watcher.max_pods}"


def test_demand_wakes_a_pool_at_zero_to_one_worker_that_returns_to_zero_when_idle(
    cluster: Cluster, namespace: str, budgeted_operator: BudgetedOperator
) -> None:
    port = free_port()
    watcher, _ = budgeted_operator("16Gi", MODELPOOL_OPERATOR_SERVER_PORT=str(port))
    manifest = slow_echo_pool(
        "wake",
        run_seconds=0,
        autoscaling={},
        replicas=0,
        min_replicas=0,
        max_replicas=2,
        idle_timeout_seconds=3,
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    zero = wait_at_zero(cluster, namespace, "wake", timeout=60, message="the pool at zero says so")
    ready = condition(zero, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ScaledToZero")
    assert "wakes the pool on its next request" in ready["message"]
    assert not worker_pods(cluster, namespace, "wake")

    # What a gateway does when it holds a request for the pool: it creates the pool's demand Lease.
    uid = cluster.kubectl("get", POOLS, "wake", "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    moment = datetime.now(UTC)
    lease = demand_lease(
        pool="wake",
        pool_uid=uid,
        moment=moment,
        holder="test",
        duration_s=6,
        pool_api_version=API_VERSION,
        pool_kind=MODELPOOL_KIND,
    )
    demand = rfc3339_ms(moment)
    assert demand is not None
    demanded = time.monotonic()
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(lease))
    woken = wait_status(
        cluster,
        namespace,
        "wake",
        lambda s: s.get("readyReplicas") == 1,
        timeout=120,
        message="one worker Ready after the demand",
    )
    created = next(t for t, kind, _, _ in watcher.history if kind == "ADDED" and t > demanded)
    print(f"\ndemand -> worker pod created: {created - demanded:.2f}s")
    assert woken["targetReplicas"] == 1
    woke = [m for r, m in reasons(cluster, namespace, "wake") if r == "WokenByDemand"]
    assert len(woke) == 1 and demand in woke[0] and "0 -> 1 worker" in woke[0], woke

    # The request the gateway held is served by the new worker.
    ip = worker_pods(cluster, namespace, "wake")[0]["status"]["podIP"]
    answer = httpx.post(
        f"http://{ip}:{port}/v1/embeddings", json={"model": "wake", "input": ["hi"]}, timeout=30
    )
    assert answer.status_code == 200, answer.text

    # Idle for idleTimeoutSeconds: evicted, back to zero; the same demand does not wake it again.
    again = wait_at_zero(
        cluster, namespace, "wake", timeout=120, message="back to zero after the idle timeout"
    )
    back = parse_time(again["autoscaling"]["scaledToZeroAt"])
    assert back is not None and back > (parse_time(demand) or back)
    assert not worker_pods(cluster, namespace, "wake")
    watcher.stop()
    assert watcher.max_pods["wake"] == 1, f"worker pods at once: {watcher.max_pods}"
    assert [r for r, _ in reasons(cluster, namespace, "wake")].count("WokenByDemand") == 1
