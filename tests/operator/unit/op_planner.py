"""Builders for the planner's tests: a spec, the parsed pool, observed workers, a ledger."""

from __future__ import annotations

from typing import Any

from modelpool_contract.api import ModelPoolSpec, ModelPoolStatus
from modelpool_contract.states import WorkerState
from modelpool_operator.budget import Ledger, ReservationBook, build_ledger
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import Plan
from modelpool_operator.pool import PoolView
from tests.operator.unit.op_pods import GI, at


def make_spec(**overrides: Any) -> ModelPoolSpec:
    body: dict[str, Any] = {
        "model": {"source": "/models/x", "task": "text-embedding"},
        "resources": {"memory": "2Gi"},
        "replicas": 2,
        "maxReplicas": 10,
        "idleTimeoutSeconds": 60,
    }
    body.update(overrides)
    return ModelPoolSpec.model_validate(body)


def view(
    spec: ModelPoolSpec | None = None,
    status: ModelPoolStatus | None = None,
    name: str = "p",
    template_hash: str = "h1",
) -> PoolView:
    return PoolView(
        namespace="ns",
        name=name,
        spec=spec or make_spec(),
        generation=1,
        status=status or ModelPoolStatus(),
        template_hash=template_hash,
    )


def w(
    name: str,
    state: WorkerState = "Ready",
    *,
    pool: str = "p",
    template_hash: str = "h1",
    last_request: float | None = None,
    since: float = 0,
    evicting: str | None = None,
    evicting_since: float | None = None,
    queue: int | None = 0,
    in_flight: int | None = 0,
    memory: int = 2 * GI,
    deleting: bool = False,
    reason: str | None = None,
) -> ObservedWorker:
    return ObservedWorker(
        name=name,
        namespace="ns",
        pool=pool,
        state=state,
        reason=reason,
        since=at(since),
        memory=0 if state in ("Failed", "Dead") else memory,
        requested_memory=memory,
        queue_depth=queue,
        in_flight=in_flight,
        last_request_time=at(last_request) if last_request is not None else None,
        template_hash=template_hash,
        evicting_reason=evicting,
        evicting_since=at(evicting_since) if evicting_since is not None else None,
        deleting=deleting,
        created=at(0),
        stats_known=True,
    )


def ledger_for(
    total: int | None, *groups: list[ObservedWorker], book: ReservationBook | None = None
) -> Ledger:
    every = [x for g in groups for x in g]
    return build_ledger(total, every, book.all() if book else ())


def cond(p: Plan, kind: str) -> tuple[str, str]:
    c = next(c for c in p.status.conditions if c.type == kind)
    return c.status, c.reason
