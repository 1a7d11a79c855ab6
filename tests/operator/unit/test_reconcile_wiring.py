"""The reconciliation pass's wiring, with an in-memory API recorder in place of the API server.

What is checked here is the ordering that the integration tests can only sample: pools planning
concurrently on one event loop see each other's reservations (no over-admission), reservations end when
the pod is observed or its creation fails, and status is only patched when it changed.  Events go to a
recording sink (the operator's own ``EventSink`` interface), so no Kopf machinery is involved.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from modelpool_contract.demand import Demand
from modelpool_operator.events import Event
from modelpool_operator.kube import ApiException
from modelpool_operator.observation import ObservationCache, slim_pod
from modelpool_operator.pool import OtherPool
from modelpool_operator.process_state import OperatorState
from modelpool_operator.reconcile import PoolRun, lifecycle_settings, reconcile_pool
from modelpool_operator.settings import OperatorConfig
from modelpool_operator.stats import StatsScraper

GI = 2**30


class RecordingKube:
    """Records the calls; ``create_pod`` yields to the loop first, like a real round trip."""

    def __init__(self, fail_creates: bool = False) -> None:
        self.created: list[dict[str, Any]] = []
        self.status_patches: list[dict[str, Any]] = []
        self.policies: list[dict[str, Any]] = []
        self.fail_creates = fail_creates
        self.fail_policies = 0  # the next N NetworkPolicy calls fail

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> bool:
        await asyncio.sleep(0.01)
        if self.fail_creates:
            raise RuntimeError("admission webhook refused the pod")
        self.created.append(body)
        return True

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        return True

    async def delete_pod(self, namespace: str, name: str, grace_period_seconds: int | None = None) -> bool:
        return True

    async def ensure_service(self, namespace: str, body: dict[str, Any]) -> None:
        await asyncio.sleep(0)

    async def ensure_network_policy(self, namespace: str, body: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        if self.fail_policies:
            self.fail_policies -= 1
            raise ApiException(status=403, reason="Forbidden")
        self.policies.append(body)

    async def patch_pool_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        self.status_patches.append(status)
        return True


class RecordingEvents:
    """An ``EventSink`` that keeps what it was given."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, Event]] = []

    def post(self, pool: dict[str, Any], event: Event) -> None:
        self.posted.append((pool["metadata"]["name"], event))


def _index(bodies: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], list[OtherPool]]:
    """The pools index: each pool parsed once, as the operator's index function does."""
    return {key: [other] for key, body in bodies.items() if (other := OtherPool.from_body(body)) is not None}


def _pool(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "model": {"source": "/models/m", "task": "text-embedding"},
            "replicas": replicas,
            "resources": {"memory": "1Gi"},
        },
    }


def _running(pod: dict[str, Any]) -> dict[str, Any]:
    pod = {**pod, "metadata": {**pod["metadata"], "uid": "u-" + pod["metadata"]["name"]}}
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "server", "ready": True, "state": {"running": {}}}],
    }
    return slim_pod(pod)


@pytest.fixture
async def state() -> AsyncIterator[OperatorState]:
    st = OperatorState(config=OperatorConfig(), events=RecordingEvents())
    st.kube = RecordingKube()  # type: ignore[assignment]
    st.scraper = StatsScraper(interval=1, timeout=0.2, concurrency=4, backoff_cap=1, default_port=8000)
    st.observations = ObservationCache(lifecycle_settings(st.config))
    yield st
    await st.scraper.aclose()


async def test_concurrent_pools_never_over_admit(state: OperatorState) -> None:
    pools = {("ns", n): _pool(n, 3) for n in ("a", "b", "c")}
    index = _index(pools)
    budgets = {"default": [{"memory": "4Gi"}]}
    runs = [PoolRun(key=key) for key in pools]

    async def one_by_one(pods: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
        """A pass of each pool in turn, as their daemons would run them."""
        for run in runs:
            await reconcile_pool(
                state, run=run, body=pools[run.key], pods_by_pool=pods, pools_by_key=index, budgets=budgets
            )

    await asyncio.gather(
        *(
            reconcile_pool(
                state,
                run=run,
                body=pools[run.key],
                pods_by_pool={},
                pools_by_key=index,
                budgets=budgets,
            )
            for run in runs
        )
    )
    kube = state.kube
    assert isinstance(kube, RecordingKube)
    assert len(kube.created) == 4  # 4 x 1Gi fit into 4Gi; the other 5 wanted workers wait
    assert sum(r.memory for r in state.reservations.all()) == 4 * GI

    # The pods show up in the watch: their reservations end, the charge now comes from the pods.
    pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in kube.created:
        pods.setdefault(("ns", pod["metadata"]["labels"]["modelpool.dev/pool"]), []).append(_running(pod))
    patches_before = len(kube.status_patches)
    await one_by_one(pods)
    assert len(state.reservations) == 0
    assert len(kube.created) == 4
    assert len(kube.status_patches) == patches_before + 3
    # Nothing changed since: no further status writes.
    await one_by_one(pods)
    assert len(kube.status_patches) == patches_before + 3


async def test_failed_create_releases_its_reservation(state: OperatorState) -> None:
    state.kube = RecordingKube(fail_creates=True)  # type: ignore[assignment]
    body = _pool("a", 2)
    with pytest.raises(RuntimeError, match="webhook"):
        await reconcile_pool(
            state,
            run=PoolRun(key=("ns", "a")),
            body=body,
            pods_by_pool={},
            pools_by_key=_index({("ns", "a"): body}),
            budgets={"default": [{"memory": "8Gi"}]},
        )
    assert len(state.reservations) == 0


async def test_demand_on_a_pool_at_zero_creates_its_worker_in_the_same_pass_once(
    state: OperatorState,
) -> None:
    body = _pool("z", 0)
    # The demand index, as the operator builds it from the pool's demand Lease.
    demand = {("ns", "z"): [Demand(datetime.now(UTC))]}
    run, index, budgets = (
        PoolRun(key=("ns", "z")),
        _index({("ns", "z"): body}),
        {"default": [{"memory": "8Gi"}]},
    )
    await reconcile_pool(
        state, run=run, body=body, pods_by_pool={}, pools_by_key=index, budgets=budgets, demand=demand
    )
    kube, events = state.kube, state.events
    assert isinstance(kube, RecordingKube) and isinstance(events, RecordingEvents)
    assert len(kube.created) == 1
    assert [e.reason for _, e in events.posted] == ["WokenByDemand", "CreatingWorker"]
    # The gateway keeps writing the same demand while its request waits: the worker is not made twice.
    pods = {("ns", "z"): [_running(kube.created[0])]}
    await reconcile_pool(
        state, run=run, body=body, pods_by_pool=pods, pools_by_key=index, budgets=budgets, demand=demand
    )
    assert len(kube.created) == 1
    assert [e.reason for _, e in events.posted].count("WokenByDemand") == 1


async def test_a_network_policy_that_fails_never_holds_up_the_workers(state: OperatorState) -> None:
    """Refused twice (a 403): the workers are created all the same, one Warning Event tells it, and a later
    pass applies it; once applied it is not sent again at every pass."""
    state.config = OperatorConfig(
        network_policy_enabled=True,
        network_policy_namespace="mp-system",
        network_policy_operator_labels={"app.kubernetes.io/name": "modelpool-operator"},
    )
    kube, events = state.kube, state.events
    assert isinstance(kube, RecordingKube) and isinstance(events, RecordingEvents)
    kube.fail_policies = 2
    body = _pool("p", 1)
    run, index, budgets = (
        PoolRun(key=("ns", "p")),
        _index({("ns", "p"): body}),
        {"default": [{"memory": "8Gi"}]},
    )

    async def one_pass() -> None:
        pods = {("ns", "p"): [_running(pod) for pod in kube.created]}
        await reconcile_pool(
            state, run=run, body=body, pods_by_pool=pods, pools_by_key=index, budgets=budgets
        )

    await one_pass()
    assert len(kube.created) == 1 and not kube.policies
    await one_pass()
    warnings = [e for _, e in events.posted if e.reason == "NetworkPolicyFailed"]
    assert len(warnings) == 1 and warnings[0].type == "Warning" and "403 Forbidden" in warnings[0].message
    await one_pass()
    await one_pass()
    assert [p["metadata"]["name"] for p in kube.policies] == ["modelpool-p"]
