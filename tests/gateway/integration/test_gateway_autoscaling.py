"""The gateway and the operator's autoscaler together, end to end: a pool at zero answers its first request
through the gateway (the gateway holds it and records demand in the pool's Lease, the operator wakes the
pool for the Lease) and returns to
zero when idle; load through the gateway beyond one worker scales the pool up, never past maxReplicas, and
back down after the scale-down delay.

Workers are real ``modelpool-server`` processes on the process node with the echo embedding handler; the
scale-up pool computes one request per 0.2 s forward pass (batches of one), so a dozen clients through the
gateway keep enough requests in flight and queued for the workers' ``/stats`` to ask for more workers.  A
pod watcher, started before the operator, records the pool's worker pods at every change for the whole test.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import openai
import pytest

from modelpool_contract.demand import demand_from_lease, demand_lease_name
from modelpool_contract.times import parse_time
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, get_json, wait_for
from testkit.load import ClosedLoop
from tests.gateway.integration.conftest import StartGateway
from tests.gateway.integration.gwharness import echo_pool
from tests.operator.integration.opharness import (
    BudgetedOperator,
    condition,
    get_pool,
    reasons,
    wait_at_zero,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Demand refreshed every second while a request is held (the default is 5 s).
GATEWAY_FLAGS = ("--demand-interval-seconds", "1")


def test_a_pool_at_zero_answers_its_first_request_through_the_gateway_and_returns_to_zero(
    crds: Cluster, namespace: str, budgeted_operator: BudgetedOperator, start_gateway: StartGateway
) -> None:
    watcher, _ = budgeted_operator("16Gi", MODELPOOL_OPERATOR_SERVER_PORT=str(free_port()))
    pool = echo_pool(
        "wake",
        replicas=0,
        max_replicas=2,
        autoscaling={},
        idle_timeout_seconds=3,
        activation_timeout_seconds=90,
    )
    apply(crds, pool, namespace)
    zero = wait_at_zero(crds, namespace, "wake", timeout=60, message="at zero")
    assert condition(zero, "Ready")["reason"] == "ScaledToZero"
    assert not worker_pods(crds, namespace, "wake")
    generation = get_pool(crds, namespace, "wake")["metadata"]["generation"]
    gateway = start_gateway([namespace], *GATEWAY_FLAGS)
    gateway.wait_serving("wake", 0, timeout=30)

    # The openai client as a user runs it: one request, held by the gateway until a worker is Ready.
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.key, max_retries=0, timeout=120)
    sent = time.monotonic()
    raw = client.embeddings.with_raw_response.create(model="wake", input=["the first request"])
    answered = time.monotonic() - sent
    print(f"\nrequest at zero -> answer through the gateway: {answered:.2f}s")
    assert raw.status_code == 200
    assert len(raw.parse().data) == 1
    woke = [m for r, m in reasons(crds, namespace, "wake") if r == "WokenByDemand"]
    assert len(woke) == 1 and "0 -> 1 worker" in woke[0], woke
    # The demand the operator woke the pool for is the one the gateway wrote in the pool's Lease; nothing
    # was written on the pool for it (same spec generation, no annotation).
    lease = get_json(crds, "leases.coordination.k8s.io", demand_lease_name("wake"), "-n", namespace)
    assert lease["spec"]["holderIdentity"].endswith(f"_{gateway.proc.pid}")
    first, last = parse_time(lease["spec"]["acquireTime"]), demand_from_lease(lease)
    woken_for = parse_time(woke[0].split("demand recorded at ", 1)[1].split(" ", 1)[0])
    assert first is not None and last is not None and woken_for is not None, (lease, woke)
    assert first - timedelta(milliseconds=1) <= woken_for <= last, (lease, woke)
    meta = get_pool(crds, namespace, "wake")["metadata"]
    assert meta["generation"] == generation
    assert not [a for a in meta.get("annotations") or {} if "demand" in a], meta.get("annotations")
    label = f"{namespace}/wake"
    assert gateway.metric("modelpool_gateway_requests_total", pool=label, code="200") == 1
    # It was held (no serving worker when it came) and released to the woken worker.
    assert gateway.metric("modelpool_gateway_hold_seconds_count", pool=label, outcome="released") == 1

    # Idle for idleTimeoutSeconds: back to zero workers, and the gateway routes to none.
    woken_at = datetime.now(UTC)
    again = wait_at_zero(crds, namespace, "wake", timeout=90, message="back to zero after the idle timeout")
    back = parse_time(again["autoscaling"]["scaledToZeroAt"])
    assert back is not None and (back - woken_at).total_seconds() > -5
    wait_for(lambda: not worker_pods(crds, namespace, "wake"), timeout=60, message="the worker pod gone")
    gateway.wait_serving("wake", 0, timeout=30)
    watcher.stop()
    assert watcher.max_pods["wake"] == 1, f"worker pods at once: {watcher.max_pods}"
    assert [r for r, _ in reasons(crds, namespace, "wake")].count("WokenByDemand") == 1


def test_load_through_the_gateway_scales_up_never_past_max_replicas_and_back_down_after_the_delay(
    crds: Cluster, namespace: str, budgeted_operator: BudgetedOperator, start_gateway: StartGateway
) -> None:
    watcher, _ = budgeted_operator("16Gi", MODELPOOL_OPERATOR_SERVER_PORT=str(free_port()))
    policy = {
        "targetPerWorker": 2,
        "scaleUpWindowSeconds": 2,
        "stableWindowSeconds": 4,
        "scaleDownDelaySeconds": 6,
    }
    pool = echo_pool(
        "auto",
        replicas=1,
        min_replicas=1,
        max_replicas=3,
        autoscaling=policy,
        env={"HANDLER_RUN_SECONDS": "0.2"},
    )
    pool["spec"]["queue"]["maxBatchSize"] = 1
    apply(crds, pool, namespace)
    gateway = start_gateway([namespace], *GATEWAY_FLAGS)
    gateway.wait_serving("auto", 1)

    # 12 requests outstanding at 2 per worker ask for 6 workers: the pool goes to maxReplicas (3).
    load = ClosedLoop(lambda _: gateway.url, "auto", clients=12, headers=gateway.headers).start()
    try:
        scaled_up = wait_status(
            crds,
            namespace,
            "auto",
            lambda s: s.get("readyReplicas") == 3,
            timeout=180,
            message="scaled up to maxReplicas, every worker Ready",
        )
        assert scaled_up["autoscaling"]["desiredReplicas"] == 3
        gateway.wait_serving("auto", 3, timeout=60)
        answered = load.answered
        wait_for(lambda: load.answered > answered, timeout=30, message="answers from three workers")
    finally:
        calm_since = datetime.now(UTC)
        load.stop()
    print(f"\nanswers by code through the gateway: {dict(load.codes)}")
    assert not load.errors, load.errors[:5]
    assert set(load.codes) <= {200, 429}, load.codes
    assert load.refused_without_retry_after == 0

    # Calm: after scaleDownDelaySeconds of lower load the pool goes back to minReplicas (one worker).
    calm = wait_status(
        crds,
        namespace,
        "auto",
        lambda s: s.get("targetReplicas") == 1 and len(s.get("workers") or []) == 1,
        timeout=90,
        message="scaled back down to one worker",
    )
    last_scale = parse_time(calm["autoscaling"]["lastScaleTime"])
    assert last_scale is not None
    # lastScaleTime is to the second: the scale-down came no sooner than the delay after the load ended.
    assert (last_scale - calm_since).total_seconds() >= policy["scaleDownDelaySeconds"] - 1
    gateway.wait_serving("auto", 1, timeout=60)
    scaled = [(r, m) for r, m in reasons(crds, namespace, "auto") if r in ("ScaledUp", "ScaledDown")]
    assert any(r == "ScaledUp" and m.endswith("-> 3 workers") for r, m in scaled), scaled
    assert any(r == "ScaledDown" and m.endswith("-> 1 workers") for r, m in scaled), scaled
    watcher.stop()
    assert 1 < watcher.max_pods["auto"] <= 3, f"worker pods at once: {watcher.max_pods}"
