"""Many passes of two pools contending for one budget, driven by random cluster events.

A tiny in-memory cluster: pods move Pending → Loading → Ready → Idle (or fail), deletions take a pass to
complete, creations appear a while after the create call.  Every pool pass does what the operator does
(ledger from all workers + reservations, plan, reserve, apply).  At every instant the memory held by pods
plus the live reservations never exceeds the budget, and Loading/Processing workers are never evicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_contract.api import ModelPoolSpec, ModelPoolStatus
from modelpool_contract.states import WorkerState
from modelpool_operator.budget import ReservationBook, build_ledger
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import plan
from modelpool_operator.pool import OtherPool, PoolView
from tests.operator.unit.op_pods import GI, at

TOTAL = 9 * GI


@dataclass
class SimPod:
    worker: ObservedWorker
    gone_after_step: int | None = None


@dataclass
class Sim:
    pods: dict[str, SimPod] = field(default_factory=dict)
    pending_creates: list[tuple[str, str, int]] = field(default_factory=list)  # pool, name, memory
    book: ReservationBook = field(default_factory=ReservationBook)
    statuses: dict[str, ModelPoolStatus] = field(default_factory=dict)
    step: int = 0

    def now(self) -> Any:
        return at(self.step)

    def held(self) -> int:
        live = self.book.prune([("ns", n) for n in self.pods])
        return sum(p.worker.memory for p in self.pods.values()) + sum(r.memory for r in live)


SPECS = {
    "a": ModelPoolSpec.model_validate(
        {
            "model": {"source": "/m", "task": "text-embedding"},
            "resources": {"memory": "2Gi"},
            "replicas": 3,
            "idleTimeoutSeconds": 5,
            "priority": 1,
        }
    ),
    "b": ModelPoolSpec.model_validate(
        {
            "model": {"source": "/m", "task": "text-embedding"},
            "resources": {"memory": "3Gi"},
            "replicas": 3,
            "idleTimeoutSeconds": 5,
            "priority": 0,
        }
    ),
}


def reconcile(sim: Sim, pool: str) -> None:
    now = sim.now()
    everyone = [p.worker for p in sim.pods.values()]
    live = sim.book.prune([w.key for w in everyone])
    ledger = build_ledger(TOTAL, everyone, live)
    other = "b" if pool == "a" else "a"
    other_status = sim.statuses.get(other, ModelPoolStatus())
    others = [
        OtherPool(
            "ns",
            other,
            SPECS[other].priority,
            SPECS[other].min_replicas,
            tuple(w for w in everyone if w.pool == other),
            waiting_memory=other_status.memory.waiting_bytes,
        )
    ]
    view = PoolView("ns", pool, SPECS[pool], 1, sim.statuses.get(pool, ModelPoolStatus()), "h1")
    out = plan(view, [w for w in everyone if w.pool == pool], ledger, now=now, others=others)
    for c in out.create:
        sim.book.reserve("ns", pool, c.name, c.memory, now)
        sim.pending_creates.append((pool, c.name, c.memory))
    for e in out.evict:
        pod = sim.pods[e.name]
        assert pod.worker.state in ("Ready", "Idle"), f"evicted a {pod.worker.state} worker"
        pod.worker = replace(
            pod.worker, state="Evicting", evicting_reason=e.reason, evicting_since=now, since=now
        )
    for d in out.delete:
        pod = sim.pods[d.name]
        assert pod.worker.state not in ("Loading", "Processing"), f"deleted a {pod.worker.state} worker"
        pod.worker = replace(pod.worker, deleting=True)
        pod.gone_after_step = sim.step + 1
    sim.statuses[pool] = out.status


def advance(sim: Sim, choice: int) -> None:
    """One cluster event chosen by ``choice``."""
    names = sorted(sim.pods)
    kind = choice % 4
    if kind == 0 and sim.pending_creates:  # a created pod shows up in the watch (or its create failed)
        pool, name, memory = sim.pending_creates.pop(0)
        if choice % 7 == 0:
            sim.book.release("ns", name)
            return
        worker = ObservedWorker(
            name=name, namespace="ns", pool=pool, state="Pending", memory=memory, requested_memory=memory
        )
        sim.pods[name] = SimPod(replace(worker, since=sim.now(), created=sim.now(), template_hash="h1"))
    elif kind == 1 and names:  # a worker moves on in its lifecycle
        pod = sim.pods[names[choice // 4 % len(names)]]
        w = pod.worker
        nxt: dict[str, WorkerState] = {
            "Pending": "Loading",
            "Loading": "Ready",
            "Ready": "Idle",
            "Idle": "Processing",
            "Processing": "Ready",
        }
        if w.deleting or w.state not in nxt:
            return
        fail = choice % 11 == 0
        state: WorkerState = "Failed" if fail else nxt[w.state]
        pod.worker = replace(
            w,
            state=state,
            since=sim.now(),
            memory=0 if fail else w.requested_memory,
            reason="OOMKilled" if fail else None,
            last_request_time=sim.now() - timedelta(seconds=10) if state == "Idle" else sim.now(),
            queue_depth=1 if state == "Processing" else 0,
        )
    # Pods whose deletion completed disappear.
    for name in [
        n for n, p in sim.pods.items() if p.gone_after_step is not None and p.gone_after_step <= sim.step
    ]:
        del sim.pods[name]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=10, max_size=120))
def test_two_pools_never_over_admit_and_never_evict_busy_workers(choices: list[int]) -> None:
    sim = Sim()
    for choice in choices:
        sim.step += 1
        if choice % 3 == 0:
            reconcile(sim, "a" if choice % 2 else "b")
        else:
            advance(sim, choice)
        assert sim.held() <= TOTAL, f"over-admitted at step {sim.step}: {sim.held() / GI:.1f}Gi > 9Gi"
        for pool, status in sim.statuses.items():
            for entry in status.workers:
                if entry.state == "Failed":
                    assert entry.memory == "0", (pool, entry)


def test_contention_converges_within_budget() -> None:
    sim = Sim()
    for round_ in range(40):
        sim.step += 1
        reconcile(sim, "b" if round_ % 2 else "a")  # a (higher priority) plans first
        for _ in range(3):
            sim.step += 1
            advance(sim, 4)  # creations appear (4: kind 0, and not a failed create)
            for name in sorted(sim.pods):
                pod = sim.pods[name]
                if pod.worker.state in ("Pending", "Loading") and not pod.worker.deleting:
                    pod.worker = replace(
                        pod.worker, state="Ready" if pod.worker.state == "Loading" else "Loading"
                    )
        assert sim.held() <= TOTAL
    ready = {
        p: sum(1 for x in sim.pods.values() if x.worker.pool == p and x.worker.state == "Ready") for p in "ab"
    }
    # 9Gi: the higher-priority pool a (2Gi x 3) fits fully, b (3Gi) gets one worker.
    assert ready["a"] == 3 and ready["b"] == 1, ready
    assert any(c.type == "BudgetExceeded" and c.status == "True" for c in sim.statuses["b"].conditions)
