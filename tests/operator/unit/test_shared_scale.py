"""A shared pool's count and retries (``planner.shared_scale``, pure) over its replicas' figures on the host
pods (``observe.hosts.hosted_workers``), what the ModelHost's pass does with them (``planner.host_models``:
the count, a failed model's retry elsewhere), what its status says (``planner.shared.shared_status``), and
the count handed from the pool's pass to its ModelHost's (``reconcile_host.shared_pools``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from modelpool_contract.demand import Demand
from modelpool_contract.times import rfc3339
from modelpool_operator.host import HostView
from modelpool_operator.observe.hosts import host_reports, hosted_workers
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.placement.ledger import Host, Resident
from modelpool_operator.planner.host_models import SharedPool, plan_models
from modelpool_operator.planner.shared import shared_status, shared_wire
from modelpool_operator.planner.shared_scale import (
    FAILING_EVERYWHERE,
    SharedCount,
    SharedScale,
    scale_shared,
)
from modelpool_operator.pool import OtherPool, PoolView
from modelpool_operator.reconcile_host import shared_pools

GI = 2**30
NS = "ns"
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def pool(status: dict[str, Any] | None = None, demand: Demand | None = None, **spec: Any) -> PoolView:
    body = {
        "metadata": {
            "name": "emb",
            "namespace": NS,
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "model": {"source": "/models/m", "task": "text-embedding"},
            "resources": {"memory": "1Gi"},
            "host": "gpus",
            **spec,
        },
        "status": status or {},
    }
    return PoolView.from_body(body, demand=demand)


def host_pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS}, "spec": {"nodeName": "n"}}


def model_doc(state: str, **figures: Any) -> dict[str, Any]:
    return {"state": state, "state_since": NOW.timestamp() - 100, "time": NOW.timestamp(), **figures}


def observed(docs: dict[str, dict[str, Any]]) -> list[ObservedWorker]:
    """The replicas, as workers, of pool emb over host pods whose /stats hold ``docs`` (by pod)."""
    pods = [host_pod(name) for name in docs]
    stats = {name: {"models": {"emb": doc}} for name, doc in docs.items()}
    return hosted_workers(NS, "emb", GI, pods, host_reports(stats))


def test_a_replicas_figures_are_the_models_own_on_its_host() -> None:
    [worker] = observed({"gpus-0": model_doc("Processing", in_flight=3, queue_depth=2, requests_total=9)})
    assert (worker.name, worker.pool, worker.state) == ("gpus-0", "emb", "Processing")
    assert (worker.in_flight, worker.queue_depth, worker.requests_total) == (3, 2, 9)
    assert worker.stats_known and worker.since == NOW - timedelta(seconds=100)


def test_load_on_the_host_pods_scales_a_shared_pool_up_within_its_host_pods() -> None:
    # Load 40 on one replica (target 10 a replica): a burst asks for 4, maxReplicas is 5, the host has 3.
    workers = observed({"gpus-0": model_doc("Processing", in_flight=8, queue_depth=32)})
    scale = scale_shared(pool(replicas=1, maxReplicas=5), workers, host_pods=3, now=NOW)
    assert scale.target == 4 and scale.count == SharedCount(3)
    assert [e.reason for e in scale.events] == ["ScaledUp"]
    assert scale.autoscaling.desired_replicas == 4 and scale.autoscaling.observed_load == 40
    fields = _status_after(scale, [], NOW)
    assert fields["targetReplicas"] == 4 and fields["specReplicas"] == 1
    # Autoscaling off (maxReplicas = minReplicas): spec.replicas is the count, whatever the load.
    fixed = scale_shared(pool(replicas=2, minReplicas=2, maxReplicas=2), workers, host_pods=3, now=NOW)
    assert fixed.count.target == 2 and fixed.events == ()


def test_a_shared_pool_at_zero_is_placed_for_fresh_gateway_demand() -> None:
    zero = {
        "targetReplicas": 0,
        "specReplicas": 1,
        "autoscaling": {"scaledToZeroAt": rfc3339(NOW - timedelta(minutes=5))},
    }
    stale = scale_shared(pool(zero, replicas=1), [], host_pods=2, now=NOW)
    assert stale.count.target == 0 and stale.events == ()
    demand = Demand.one(NOW - timedelta(seconds=1), 30, held=1)
    woken = scale_shared(pool(zero, demand, replicas=1), [], host_pods=2, now=NOW)
    assert woken.count.target == 1 and [e.reason for e in woken.events] == ["WokenByDemand"]
    assert woken.autoscaling.woken_by_demand_at is not None


def test_an_idle_replica_sleeps_on_its_host_then_is_unloaded_after_twice_the_idle_timeout() -> None:
    last = NOW - timedelta(seconds=150)
    workers = observed({"gpus-0": model_doc("Sleeping", last_request_time=last.timestamp())})
    spec: dict[str, Any] = {"replicas": 1, "idleTimeoutSeconds": 100}
    waiting = scale_shared(pool(**spec), workers, host_pods=1, now=NOW)
    assert waiting.count.target == 1 and waiting.requeue_after == 50
    later = scale_shared(pool(**spec), workers, host_pods=1, now=NOW + timedelta(seconds=60))
    assert later.count.target == 0 and [e.reason for e in later.events] == ["IdleUnload"]
    assert later.autoscaling.scaled_to_zero_at is not None
    # Never below minReplicas; recorded demand counts as use.
    kept = scale_shared(pool(minReplicas=1, **spec), workers, host_pods=1, now=NOW + timedelta(seconds=60))
    assert kept.count.target == 1
    demand = Demand(at=NOW, duration_s=30)
    used = scale_shared(pool(demand=demand, **spec), workers, host_pods=1, now=NOW + timedelta(seconds=60))
    assert used.count.target == 1
    # Requests held at the gateway (a fresh held count): the model that was just placed for them stays.
    held = Demand.one(NOW - timedelta(seconds=200), 300, held=1)
    waited = scale_shared(pool(demand=held, **spec), workers, host_pods=1, now=NOW + timedelta(seconds=60))
    assert waited.count.target == 1 and waited.requeue_after == 100


def _status_after(scale: SharedScale, replicas: list[ObservedWorker], now: datetime) -> dict[str, Any]:
    return shared_wire(shared_status(pool(replicas=1), replicas, None, now, scale))


def test_a_failed_model_backs_off_then_is_retried_and_a_new_failure_counts_again() -> None:
    workers = observed({"gpus-0": model_doc("Failed", reason="OOM")})
    first = scale_shared(pool(replicas=1), workers, host_pods=2, now=NOW)
    assert first.count.retry == frozenset()
    assert [e.reason for e in first.events] == ["BackOff"] and first.requeue_after == 5
    status = _status_after(first, workers, NOW)
    assert status["backoff"]["failures"] == 1 and status["workers"][0]["since"]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["reason"] == "Failed" and "OOM; retrying in 5s" in ready["message"]
    # The same failure, seen again once the backoff ran out: retried there, not counted again.
    due = scale_shared(pool(status, replicas=1), workers, host_pods=2, now=NOW + timedelta(seconds=6))
    assert due.count.retry == frozenset({"gpus-0"}) and due.events == () and due.backoff.failures == 1
    # A new failure (a later failure time) counts again, with a longer delay.
    workers = observed({"gpus-1": {**model_doc("Failed"), "state_since": NOW.timestamp() + 7}})
    second = scale_shared(pool(status, replicas=1), workers, host_pods=2, now=NOW + timedelta(seconds=8))
    assert (
        second.backoff.failures == 2 and second.requeue_after == 10 and second.backoff.last_worker == "gpus-1"
    )
    # As many failures in a row as host pods, serving nowhere: the Ready condition says so.
    assert second.failing_everywhere is not None
    ready = {c["type"]: c for c in _status_after(second, workers, NOW)["conditions"]}["Ready"]
    assert ready["reason"] == FAILING_EVERYWHERE and "failed 2 times in a row" in ready["message"]


def test_the_modelhosts_pass_places_a_failed_model_elsewhere_and_retries_it_after_the_backoff() -> None:
    failed = Resident(pool=(NS, "emb"), state="Failed", device=0, declared=GI)
    serving = Resident(pool=(NS, "emb"), state="Ready", device=0, declared=GI)
    load = '{"source": "/models/m"}'
    waiting = SharedPool("emb", 1, load, GI)
    retry = SharedPool("emb", 1, load, GI, retry=frozenset({"gpus-0"}))
    hosts = [Host("gpus-0", (4 * GI,), 8 * GI, (failed,)), Host("gpus-1", (4 * GI,), 8 * GI)]
    # A failed model is no replica: the pool goes elsewhere at once; the failure stays until its retry.
    assert [(c.action, c.pod) for c in plan_models(NS, hosts, [waiting]).calls] == [("load", "gpus-1")]
    placed = [hosts[0], Host("gpus-1", (4 * GI,), 8 * GI, (serving,))]
    assert plan_models(NS, placed, [waiting]).calls == ()
    assert [(c.action, c.pod) for c in plan_models(NS, placed, [retry]).calls] == [("unload", "gpus-0")]
    # Alone on its host: unloaded when due, loaded again by the next pass (not in the same one).
    alone = plan_models(NS, hosts[:1], [retry]).calls
    assert [(c.action, c.pod, c.why) for c in alone] == [
        ("unload", "gpus-0", "it failed and its pool's backoff is over: tried again")
    ]
    empty = Host("gpus-0", (4 * GI,), 8 * GI)
    assert [(c.action, c.pod) for c in plan_models(NS, [empty], [retry]).calls] == [("load", "gpus-0")]


def test_the_modelhosts_pass_takes_each_pools_count_from_its_pass_else_its_status() -> None:
    host = HostView.from_body(
        {
            "metadata": {"name": "gpus", "namespace": NS},
            "spec": {"replicas": 2, "gpusPerHost": 1, "deviceMemory": "4Gi"},
        }
    )

    def indexed(status: dict[str, Any]) -> dict[tuple[str, str], list[OtherPool]]:
        body = {
            "metadata": {"name": "emb", "namespace": NS, "uid": "u1"},
            "spec": {
                "model": {"source": "/models/m", "task": "text-embedding"},
                "resources": {"memory": "1Gi"},
                "host": "gpus",
                "replicas": 1,
            },
            "status": status,
        }
        other = OtherPool.from_body(body)
        assert other is not None and other.reference()["metadata"]["uid"] == "u1"
        return {(NS, "emb"): [other]}

    [spec] = shared_pools(host, indexed({}))
    assert spec.replicas == 1 and spec.retry == frozenset()
    [recorded] = shared_pools(host, indexed({"targetReplicas": 5, "specReplicas": 1}))
    assert recorded.replicas == 2  # the count its status records, at most the host pods
    [outdated] = shared_pools(host, indexed({"targetReplicas": 0, "specReplicas": 3}))
    assert outdated.replicas == 1  # recorded for another spec.replicas: not this one's
    counts = {(NS, "emb"): SharedCount(0, frozenset({"gpus-0"}))}
    [decided] = shared_pools(host, indexed({}), counts)
    assert (decided.replicas, decided.retry) == (0, frozenset({"gpus-0"}))
