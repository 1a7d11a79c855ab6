"""The reconciliation pass's wiring, with an in-memory API recorder in place of the API server.

What is checked here is the ordering that the integration tests can only sample: pools planning
concurrently on one event loop see each other's reservations (no over-admission), reservations end when
the pod is observed or its creation fails, and status is only patched when it changed.  Events go to a
recording sink (the operator's own ``EventSink`` interface), so no Kopf machinery is involved.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from modelpool_contract.demand import Demand
from modelpool_operator.bookkeeping import Bookkeeping, PoolRun
from modelpool_operator.effects.apply import settle_reservations, start_eviction
from modelpool_operator.effects.host_control import HttpHostControl
from modelpool_operator.effects.kube import ApiException, NameTakenError
from modelpool_operator.effects.resources import worker_template_hash
from modelpool_operator.metrics import OperatorMetrics
from modelpool_operator.observe.observation import ObservationCache, pod_indexed, slim_pod
from modelpool_operator.planner import Event, Evict, Plan
from modelpool_operator.planner.status_pace import GATHER_S, ROUTINE_HOLD_S
from modelpool_operator.pool import OtherPool, PoolView, worker_name
from modelpool_operator.reconcile import reconcile_pool
from modelpool_operator.reconcile_budget import budget_status_wire
from modelpool_operator.services import Services, lifecycle_settings, make_scraper, pod_settings
from modelpool_operator.settings import OperatorConfig

GI = 2**30
# The operator's control seed (the ModelHosts' control keys are derived from it).
SEED = b"wiring-test-control-seed-0123456789"


def api_error(status: int, message: str) -> ApiException:
    """An ApiException as kubernetes_asyncio raises it: the API server's Status object in the body."""
    error = ApiException(status=status, reason="Forbidden" if status == 403 else "Error")
    # A str, as Kube._drop_answer raises it (the client's stubs type the body as bytes; both parse alike).
    error.body = json.dumps(  # type: ignore[assignment]
        {"kind": "Status", "status": "Failure", "message": message, "code": status}
    )
    return error


QUOTA = (
    'services "a" is forbidden: exceeded quota: svc, requested: services=1, used: services=0, '
    "limited: services=0"
)


class RecordingKube:
    """Records the calls; ``create_pod`` yields to the loop first, like a real round trip."""

    def __init__(self, fail_creates: BaseException | None = None) -> None:
        self.created: list[dict[str, Any]] = []
        self.status_patches: list[dict[str, Any]] = []
        self.host_status_patches: list[dict[str, Any]] = []
        self.secrets: list[dict[str, Any]] = []
        self.policies: list[dict[str, Any]] = []
        self.services: list[dict[str, Any]] = []
        self.budgets: list[dict[str, Any]] = []  # PodDisruptionBudgets, as sent
        self.inference_pools: list[dict[str, Any]] = []  # InferencePools, as sent
        self.inference_pools_deleted: list[str] = []
        self.owned_deleted: list[tuple[str, str, str]] = []  # (kind, name, owner uid)
        self.fail_creates = fail_creates  # every create raises this (after taking effect if "made" is set)
        self.made_anyway = False  # a create that fails without an answer still made its pod
        self.fail_services: BaseException | None = None
        self.fail_policies = 0  # the next N NetworkPolicy calls fail
        self.existing: set[str] = set()  # pods that exist (created ones join)
        self.asked: list[str] = []
        self.pod_patches: list[tuple[str, dict[str, Any]]] = []
        self.foreign: set[str] = set()  # names of pods and Secrets that exist and are someone else's
        self.secret_tries = 0
        self.disrupted: dict[str, datetime] = {}  # a PodDisruptionBudget's status.disruptedPods

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> bool:
        await asyncio.sleep(0.01)
        if body["metadata"]["name"] in self.foreign:
            raise NameTakenError(f"pod {namespace}/{body['metadata']['name']} is someone else's")
        if self.fail_creates is not None:
            if self.made_anyway:
                self.existing.add(body["metadata"]["name"])
            raise self.fail_creates
        self.created.append(dict(body))
        self.existing.add(body["metadata"]["name"])
        return True

    async def pod_exists(self, namespace: str, name: str) -> bool:
        self.asked.append(name)
        return name in self.existing

    async def disrupted_pods(self, namespace: str, name: str) -> dict[str, datetime]:
        return dict(self.disrupted)

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        self.pod_patches.append((name, dict(patch)))
        return True

    async def delete_pod(self, namespace: str, name: str, grace_period_seconds: int | None = None) -> bool:
        return True

    async def ensure_service(self, namespace: str, body: Mapping[str, Any]) -> None:
        await asyncio.sleep(0)
        if self.fail_services is not None:
            raise self.fail_services
        self.services.append(dict(body))

    async def ensure_network_policy(self, namespace: str, body: Mapping[str, Any]) -> None:
        await asyncio.sleep(0)
        if self.fail_policies:
            self.fail_policies -= 1
            raise ApiException(status=403, reason="Forbidden")
        self.policies.append(dict(body))

    async def ensure_disruption_budget(self, namespace: str, body: Mapping[str, Any]) -> None:
        await asyncio.sleep(0)
        self.budgets.append(dict(body))

    async def ensure_inference_pool(self, namespace: str, body: Mapping[str, Any]) -> None:
        await asyncio.sleep(0)
        self.inference_pools.append(dict(body))

    async def delete_inference_pool(self, namespace: str, name: str, owner_uid: str | None) -> bool:
        self.inference_pools_deleted.append(name)
        return False

    async def patch_pool_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        self.status_patches.append(dict(status))
        return True

    async def patch_budget_status(self, name: str, status: Mapping[str, Any]) -> bool:
        return True

    async def create_budget(self, body: Mapping[str, Any]) -> bool:
        return True

    async def delete_owned(self, namespace: str, kind: str, name: str, owner_uid: str) -> bool:
        self.owned_deleted.append((kind, name, owner_uid))
        return True

    async def patch_host_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        self.host_status_patches.append(dict(status))
        return True

    async def ensure_control_key_secret(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """As the API server with the Secret the operator's own: one that exists is kept (False); none is
        ever read back. One named in ``foreign`` is someone else's (NameTakenError)."""
        self.secret_tries += 1
        if body["metadata"]["name"] in self.foreign:
            raise NameTakenError(f"Secret {namespace}/{body['metadata']['name']} is someone else's")
        if any(s["metadata"]["name"] == body["metadata"]["name"] for s in self.secrets):
            return False
        self.secrets.append(dict(body))
        return True

    async def close(self) -> None:
        return None


class RecordingEvents:
    """An ``EventSink`` that keeps what it was given."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, Event]] = []

    def post(self, pool: Mapping[str, Any], event: Event) -> None:
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


def _running(pod: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
    """``pod`` running, as the index keeps it; ``ready``: with its Ready condition (a budget counts it)."""
    pod = {**pod, "metadata": {**pod["metadata"], "uid": "u-" + pod["metadata"]["name"]}}
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "server", "ready": True, "state": {"running": {}}}],
    }
    if ready:
        condition = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
        pod["status"]["conditions"] = [condition]
    return slim_pod(pod)


@dataclass
class Operator:
    """An operator process's services (recording the API and the Events) and bookkeeping."""

    services: Services
    book: Bookkeeping

    @property
    def kube(self) -> RecordingKube:
        return cast(RecordingKube, self.services.kube)

    @property
    def events(self) -> RecordingEvents:
        return cast(RecordingEvents, self.services.events)

    def use(self, **changes: Any) -> None:
        """Other services (they are immutable: a process builds them once)."""
        self.services = replace(self.services, **changes)


def recording_operator(config: OperatorConfig) -> Operator:
    """Services that record the API requests and the Events, and fresh bookkeeping."""
    services = Services(
        config=config,
        kube=RecordingKube(),
        scraper=make_scraper(config),
        observations=ObservationCache(lifecycle_settings(config)),
        events=RecordingEvents(),
        metrics=OperatorMetrics(),
        host_control=HttpHostControl(),
        control_seed=SEED,
    )
    return Operator(services, Bookkeeping())


@pytest.fixture
async def state() -> AsyncIterator[Operator]:
    operator = recording_operator(OperatorConfig())
    yield operator
    await operator.services.scraper.aclose()


# A budget with room for every pool of these tests.
ROOMY: dict[str, Any] = {"default": [{"memory": "8Gi"}]}


@dataclass
class OnePool:
    """One pool's passes as its daemon runs them (one ``PoolRun`` from pass to pass): ``reconcile_pool``
    over ``body``, the pools index (``index``; else the pool alone) and the budgets index (``budgets``)."""

    state: Operator
    body: dict[str, Any]
    budgets: Mapping[str, Any] = field(default_factory=lambda: ROOMY)
    index: Mapping[tuple[str, str], list[OtherPool]] | None = None

    def __post_init__(self) -> None:
        self.run = PoolRun(key=(self.body["metadata"]["namespace"], self.body["metadata"]["name"]))

    async def reconcile(
        self, pods: Mapping[tuple[str, str], list[dict[str, Any]]] | None = None, **more: Any
    ) -> Plan | None:
        """One pass over ``pods`` (the pods index; none by default); ``more``: the demand or hosts index."""
        return await reconcile_pool(
            self.state.services,
            self.state.book,
            run=self.run,
            body=self.body,
            pods_by_pool={} if pods is None else pods,
            pools_by_key=_index({self.run.key: self.body}) if self.index is None else self.index,
            budgets=self.budgets,
            **more,
        )

    async def over_created(self, **more: Any) -> Plan | None:
        """One pass over the workers created so far, each observed running."""
        created = {self.run.key: [_running(pod) for pod in self.state.kube.created]}
        return await self.reconcile(created, **more)


async def test_concurrent_pools_never_over_admit(state: Operator) -> None:
    pools = {("ns", n): _pool(n, 3) for n in ("a", "b", "c")}
    index = _index(pools)
    budgets = {"default": [{"memory": "4Gi"}]}
    passes = [OnePool(state, body, budgets, index) for body in pools.values()]

    async def one_by_one(pods: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
        """A pass of each pool in turn, as their daemons would run them."""
        for pool in passes:
            await pool.reconcile(pods)

    await asyncio.gather(*(pool.reconcile() for pool in passes))
    kube = state.kube
    assert isinstance(kube, RecordingKube)
    assert len(kube.created) == 4  # 4 x 1Gi fit into 4Gi; the other 5 wanted workers wait
    assert sum(r.memory for r in state.book.reservations.all()) == 4 * GI

    # The pods show up in the watch: their reservations end, the charge now comes from the pods.
    pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in kube.created:
        pods.setdefault(("ns", pod["metadata"]["labels"]["modelpool.dev/pool"]), []).append(_running(pod))
    patches_before = len(kube.status_patches)
    await one_by_one(pods)
    assert len(state.book.reservations) == 0
    assert len(kube.created) == 4
    # a's and b's workers are Pending: those pools are being created, and their progress waits for the
    # pace (``planner.status_pace``: the workers appearing are a routine detail, held ROUTINE_HOLD_S after
    # the last write and GATHER_S after the change), each asking for a pass then; c's is written at once.
    assert len(kube.status_patches) == patches_before + 1
    assert [bool(pool.run.status_due) for pool in passes] == [True, True, False]
    for pool in passes:  # the pace's wait passes
        pool.run.status_written_at = (pool.run.status_written_at or 0.0) - ROUTINE_HOLD_S
        pool.run.status_held_at = (pool.run.status_held_at or 0.0) - GATHER_S
    await one_by_one(pods)
    assert len(kube.status_patches) == patches_before + 3
    # Nothing changed since: no further status writes.
    await one_by_one(pods)
    assert len(kube.status_patches) == patches_before + 3


async def test_a_creations_worker_ready_events_go_as_one_when_the_pool_settles(state: Operator) -> None:
    # issue 36: the pass that starts the creation tells its decision at once; the workers' WorkerReady
    # Events wait while the pool is being created and go as one Event when it settles.
    pool = OnePool(state, _pool("r", 3))
    await pool.reconcile()
    kube, events = state.kube, state.events
    assert isinstance(kube, RecordingKube) and isinstance(events, RecordingEvents)
    assert [e.reason for _, e in events.posted] == ["CreatingWorker"]
    pods = [_pending(pod) for pod in kube.created]
    await pool.reconcile({pool.run.key: pods})
    for i, pod in enumerate(kube.created):
        pods[i] = _running(pod, ready=True)
        started = {"running": {"startedAt": "2026-12-01T00:00:00Z"}}  # a running container (with a time)
        pods[i]["status"]["containerStatuses"][0]["state"] = started
        # Past the status pace's interval: every pass writes its status, only the Events are held.
        pool.run.status_written_at = None
        await pool.reconcile({pool.run.key: list(pods)})
        if i < 2:
            assert pool.run.status_due is None and len(pool.run.held_events) == i + 1
    names = sorted(pod["metadata"]["name"] for pod in kube.created)
    assert [e.reason for _, e in events.posted] == ["CreatingWorker", "WorkerReady"]
    ready = events.posted[-1][1]
    assert sorted(ready.message.split("; ")) == [f"worker {name} is ready" for name in names]
    assert pool.run.held_events == [] and pool.run.events_held_at is None


def _pending(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` created and not yet scheduled, as the index keeps it."""
    return slim_pod({**pod, "metadata": {**pod["metadata"], "uid": "u-" + pod["metadata"]["name"]}})


def _conditions(patch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in patch.get("conditions") or []}


async def test_a_refused_create_releases_its_reservation_and_reports_the_api_message(
    state: Operator,
) -> None:
    quota = "pods is forbidden: exceeded quota: q, requested: pods=1, used: pods=0, limited: pods=0"
    state.use(kube=RecordingKube(fail_creates=api_error(403, quota)))
    pool = OnePool(state, _pool("a", 2))
    for _ in range(2):  # the pass never raises; the same failure is told once
        await pool.reconcile()
    assert len(state.book.reservations) == 0
    kube, events = state.kube, state.events
    assert isinstance(kube, RecordingKube) and isinstance(events, RecordingEvents)
    failed = [e for _, e in events.posted if e.reason == "CreateFailed"]
    assert len(failed) == 2 and all(e.type == "Warning" for e in failed)  # two workers, once each
    assert len({e.message for e in failed}) == 2
    assert all(e.message.startswith("worker a-") and e.message.endswith(f": 403 {quota}") for e in failed)
    api = _conditions(kube.status_patches[0])["ApiError"]
    assert (api["status"], api["reason"]) == ("True", "CreateFailed") and quota in api["message"]


async def test_a_worker_name_held_by_someone_elses_pod_is_reported_and_another_name_is_used(
    state: Operator,
) -> None:
    """A create meets a pod of the name that is not the pool's: not counted as made (its reservation ends),
    NameTaken told, and the next pass makes the worker under the next free name."""
    pool = OnePool(state, _pool("a", 1))
    rendered = worker_template_hash(PoolView.from_body(pool.body), pod_settings(state.services.config))
    first = worker_name("a", rendered, 0)
    state.kube.foreign.add(first)
    await pool.reconcile()
    assert state.kube.created == [] and len(state.book.reservations) == 0
    api = _conditions(state.kube.status_patches[0])["ApiError"]
    assert (api["status"], api["reason"]) == ("True", "NameTaken")
    assert [e.reason for _, e in state.events.posted if e.type == "Warning"] == ["NameTaken"]
    await pool.reconcile()
    [made] = state.kube.created
    assert made["metadata"]["name"] == worker_name("a", rendered, 1)


async def test_a_create_without_an_answer_keeps_its_memory_until_the_pod_is_known_absent(
    state: Operator,
) -> None:
    """A timeout: the pod may exist, so the reservation stays (and the pool does not create it twice)
    until the pod is observed or, asked after the check interval, known absent."""
    kube = RecordingKube(fail_creates=TimeoutError())
    state.use(kube=kube)
    pool = OnePool(state, _pool("a", 1))
    await pool.reconcile()
    (held,) = state.book.reservations.all()
    await pool.reconcile()  # in flight: not created again, not released
    assert state.book.reservations.all() == (held,) and not kube.asked
    # The check interval passed and the API says the pod does not exist: its memory is free again.
    await settle_reservations(state.services, state.book, datetime.now(UTC) + timedelta(hours=1))
    assert kube.asked == [held.worker] and len(state.book.reservations) == 0

    # The same, but the create had made the pod: asked, it exists, so the reservation stays.
    kube.made_anyway = True
    await pool.reconcile()
    await settle_reservations(state.services, state.book, datetime.now(UTC) + timedelta(hours=1))
    assert kube.asked == [held.worker, held.worker] and len(state.book.reservations) == 1


async def test_a_due_reservation_whose_pod_the_index_shows_is_not_asked_about(state: Operator) -> None:
    """At scale a pool's pass comes late, so its reservations go due with their pods already watched: the
    index answers (the pod exists; the reservation ends at the pool's pass, which charges the pod), not
    one API request each."""
    kube = RecordingKube()
    state.use(kube=kube)
    await OnePool(state, _pool("a", 1)).reconcile()
    (held,) = state.book.reservations.all()
    watched = {("ns", "a"): [{"metadata": {"name": held.worker, "namespace": "ns"}}]}
    later = datetime.now(UTC) + timedelta(hours=1)
    await settle_reservations(
        state.services, state.book, later, indexed=lambda r: pod_indexed(watched, r.pool_key, r.worker)
    )
    assert not kube.asked and [r.key for r in state.book.reservations.all()] == [held.key]
    await settle_reservations(state.services, state.book, later + timedelta(hours=1))  # not in the index
    assert kube.asked == [held.worker]


async def test_a_service_that_cannot_be_created_never_keeps_workers_from_starting(
    state: Operator,
) -> None:
    """The Service IP range full, a quota on services: the workers are created all the same, the
    condition ApiError and one Warning Event carry the API server's own message, the pass does not raise;
    a later pass makes the Service and the condition turns False."""
    kube, events = state.kube, state.events
    assert isinstance(kube, RecordingKube) and isinstance(events, RecordingEvents)
    kube.fail_services = api_error(403, QUOTA)
    pool = OnePool(state, _pool("a", 2))
    one_pass, run = pool.over_created, pool.run
    await one_pass()
    assert len(kube.created) == 2 and not kube.services
    api = _conditions(kube.status_patches[-1])["ApiError"]
    assert (api["status"], api["reason"]) == ("True", "ServiceFailed")
    assert api["message"] == f"Service a: 403 {QUOTA}"
    await one_pass()
    told = [e for _, e in events.posted if e.reason == "ServiceFailed"]
    assert [(e.type, e.message) for e in told] == [("Warning", f"Service a: 403 {QUOTA}")]

    kube.fail_services = None
    await one_pass()
    assert [s["spec"]["clusterIP"] for s in kube.services] == ["None"]
    assert run.last_status is not None
    api_cond = next(c for c in run.last_status.conditions if c.type == "ApiError")
    assert (api_cond.status, api_cond.reason) == ("False", "RequestsSucceeded")


async def test_demand_on_a_pool_at_zero_creates_its_worker_in_the_same_pass_once(
    state: Operator,
) -> None:
    pool = OnePool(state, _pool("z", 0))
    # The demand index, as the operator builds it from the pool's demand Lease.
    demand = {("ns", "z"): [Demand(datetime.now(UTC))]}
    await pool.reconcile(demand=demand)
    kube, events = state.kube, state.events
    assert isinstance(kube, RecordingKube) and isinstance(events, RecordingEvents)
    assert len(kube.created) == 1
    assert [e.reason for _, e in events.posted] == ["WokenByDemand", "CreatingWorker"]
    # The gateway keeps writing the same demand while its request waits: the worker is not made twice.
    await pool.over_created(demand=demand)
    assert len(kube.created) == 1
    assert [e.reason for _, e in events.posted].count("WokenByDemand") == 1


async def test_a_network_policy_that_fails_never_holds_up_the_workers(state: Operator) -> None:
    """Refused twice (a 403): the workers are created all the same, one Warning Event tells it, and a later
    pass applies it; once applied it is not sent again at every pass."""
    state.use(
        config=OperatorConfig(
            network_policy_enabled=True,
            network_policy_namespace="mp-system",
            network_policy_operator_labels={"app.kubernetes.io/name": "modelpool-operator"},
        )
    )
    kube, events = state.kube, state.events
    assert isinstance(kube, RecordingKube) and isinstance(events, RecordingEvents)
    kube.fail_policies = 2
    one_pass = OnePool(state, _pool("p", 1)).over_created
    await one_pass()
    assert len(kube.created) == 1 and not kube.policies
    await one_pass()
    warnings = [e for _, e in events.posted if e.reason == "NetworkPolicyFailed"]
    assert len(warnings) == 1 and warnings[0].type == "Warning" and "403 Forbidden" in warnings[0].message
    await one_pass()
    await one_pass()
    assert [p["metadata"]["name"] for p in kube.policies] == ["modelpool-p"]


async def test_a_pools_disruption_budget_follows_its_target_and_is_sent_only_when_it_changes(
    state: Operator,
) -> None:
    """The PodDisruptionBudget's minAvailable is the target less spec.disruption.maxUnavailable: written at
    the first pass, again when the target moves, not at every pass."""
    kube, pool = state.kube, OnePool(state, _pool("p", 1))

    async def one_pass(body: dict[str, Any]) -> None:
        pool.body = body  # the pool as the watch shows it now
        await pool.over_created()

    await one_pass(_pool("p", 1))
    await one_pass(_pool("p", 1))
    assert [(b["metadata"]["name"], b["spec"]["minAvailable"]) for b in kube.budgets] == [("modelpool-p", 0)]
    (budget,) = kube.budgets
    assert budget["spec"]["selector"] == {
        "matchLabels": {"modelpool.dev/pool": "p", "modelpool.dev/serving": "true"}
    }
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert budget["metadata"]["ownerReferences"][0]["uid"] == "uid-p"
    await one_pass(_pool("p", 3))
    await one_pass(_pool("p", 3))
    assert [b["spec"]["minAvailable"] for b in kube.budgets] == [0, 2]
    strict = _pool("p", 3)
    strict["spec"]["disruption"] = {"maxUnavailable": 0}
    await one_pass(strict)
    assert [b["spec"]["minAvailable"] for b in kube.budgets] == [0, 2, 3]


async def test_a_worker_a_drain_evicted_is_replaced_under_another_name(state: Operator) -> None:
    """Its name stays in the pool's PodDisruptionBudget (``status.disruptedPods``) for up to 2 minutes, and
    a replacement of that name would count for nothing there meanwhile (``planner.disrupted``)."""
    pool = OnePool(state, _pool("a", 2))
    rendered = worker_template_hash(PoolView.from_body(pool.body), pod_settings(state.services.config))
    await pool.reconcile()
    ready = [_running(p, ready=True) for p in state.kube.created]
    await pool.reconcile({pool.run.key: ready})  # both seen Ready and serving
    await pool.reconcile({pool.run.key: ready[1:]})  # the first one gone: a drain evicted it
    assert [p["metadata"]["name"] for p in state.kube.created[2:]] == [worker_name("a", rendered, 2)]


async def test_a_host_pod_a_drain_evicted_is_made_again_once_its_budget_forgets_the_name(
    state: Operator,
) -> None:
    """A host pod keeps its name (``<host>-<index>``): its replacement waits while the ModelHost's budget,
    read afresh, records the evicted pod's name, and the pass comes back within a second."""
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.host import host_charge_key
    from modelpool_operator.observe.ownership import OwnedPods, host_record
    from modelpool_operator.reconcile_host import HELD_RETRY_S, reconcile_host

    run, body = HostRun(key=("ns", "gpus")), _host(2)
    pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
    view = OwnedPods(pods, {host_charge_key("ns", "gpus"): host_record(body)}.get)

    async def host_pass() -> None:
        await reconcile_host(
            state.services, state.book, run=run, body=body, pods_by_pool=view, pools_by_key={}, budgets=ROOMY
        )

    await host_pass()
    ready = [_running(p, ready=True) for p in state.kube.created]
    pods[host_charge_key("ns", "gpus")] = ready
    await host_pass()  # both seen Ready
    pods[host_charge_key("ns", "gpus")] = ready[1:]  # gpus-0 evicted and gone
    state.kube.disrupted = {"gpus-0": datetime.now(UTC)}
    await host_pass()
    assert len(state.kube.created) == 2 and run.retry_in is not None and run.retry_in <= HELD_RETRY_S
    state.kube.disrupted = {}  # the disruption controller saw it go
    await host_pass()
    assert [p["metadata"]["name"] for p in state.kube.created[2:]] == ["gpus-0"]


def _llm_pool(inference_pool: dict[str, Any] | None) -> dict[str, Any]:
    body = _pool("p", 1)
    body["spec"]["model"]["task"] = "text-generation"
    if inference_pool is not None:
        body["spec"]["inferencePool"] = inference_pool
    return body


async def test_a_pools_inference_pool_follows_its_spec_and_is_sent_only_when_it_changes(
    state: Operator,
) -> None:
    """spec.inferencePool (issue 33): nothing asked of the API while the operator may not make
    InferencePools (the pool is told InferencePoolsDisabled); once it may, the InferencePool is written at
    the first pass, again when the spec changes it, and removed once when the field goes, and the
    NetworkPolicy admits the picker while the field is set."""
    kube, events = state.kube, state.events
    run, budgets = PoolRun(key=("ns", "p")), {"default": [{"memory": "8Gi"}]}

    async def one_pass(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
        pods = {("ns", "p"): [_running(pod) for pod in kube.created]}
        await reconcile_pool(
            state.services,
            state.book,
            run=run,
            body=body,
            pods_by_pool=pods,
            pools_by_key=_index({("ns", "p"): body}),
            budgets=budgets,
        )
        return _conditions(kube.status_patches[-1]) if kube.status_patches else {}

    asked = _llm_pool({"endpointPicker": "epp", "pickerPodLabels": {"app": "epp"}})
    conditions = await one_pass(asked)
    assert not kube.inference_pools and not kube.inference_pools_deleted
    assert conditions["ApiError"]["reason"] == "InferencePoolsDisabled"
    assert [e.reason for _, e in events.posted if e.type == "Warning"] == ["InferencePoolsDisabled"]

    state.use(
        config=OperatorConfig(
            inference_pools_enabled=True,
            network_policy_enabled=True,
            network_policy_namespace="mp-system",
            network_policy_operator_labels={"app.kubernetes.io/name": "modelpool-operator"},
        )
    )
    await one_pass(asked)
    await one_pass(asked)
    (made,) = kube.inference_pools
    assert made["spec"]["selector"] == {
        "matchLabels": {"modelpool.dev/pool": "p", "modelpool.dev/serving": "true"}
    }
    assert made["spec"]["endpointPickerRef"]["name"] == "epp"
    picker = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns"}}}
    picker["podSelector"] = {"matchLabels": {"app": "epp"}}
    assert all(picker in rule["from"] for rule in kube.policies[-1]["spec"]["ingress"])
    moved = _llm_pool(
        {"endpointPicker": "epp", "endpointPickerPort": 9003, "pickerPodLabels": {"app": "epp"}}
    )
    await one_pass(moved)
    assert [p["spec"]["endpointPickerRef"]["port"] for p in kube.inference_pools] == [
        {"number": 9002},
        {"number": 9003},
    ]
    await one_pass(_llm_pool(None))
    await one_pass(_llm_pool(None))
    assert kube.inference_pools_deleted == ["p"] and len(kube.inference_pools) == 2
    assert not any(picker in rule["from"] for rule in kube.policies[-1]["spec"]["ingress"])


async def test_the_budget_status_says_why_an_invalid_budget_admits_nothing(state: Operator) -> None:
    invalid = budget_status_wire(
        state.services, state.book, {}, {"default": [{"memory": "1e41"}]}, previous=None, generation=3
    )
    (valid,) = invalid["conditions"]
    assert (valid["type"], valid["status"], valid["reason"]) == ("Valid", "False", "InvalidSpec")
    assert valid["message"].startswith("ModelBudget default is invalid: spec.memory: invalid quantity '1e41'")
    assert valid["message"].endswith("; no worker is admitted until it is fixed")
    fixed = budget_status_wire(
        state.services, state.book, {}, {"default": [{"memory": "8Gi"}]}, previous=invalid, generation=4
    )
    (valid,) = fixed["conditions"]
    assert (valid["status"], valid["reason"], valid["message"]) == (
        "True",
        "SpecValid",
        "workers are admitted within 8Gi",
    )
    again = budget_status_wire(
        state.services, state.book, {}, {"default": [{"memory": "8Gi"}]}, previous=fixed, generation=4
    )
    assert again == fixed  # nothing to write while nothing changes


async def test_an_eviction_records_the_state_the_planner_observed_in_its_one_patch(
    state: Operator,
) -> None:
    """Follow-up of issue 19: the state the plan decided on reaches the pod with the eviction mark, in the
    same patch (the soak's auditor judges "never Loading or Processing" on it)."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    await start_eviction(
        state.services,
        state.book,
        PoolRun(key=("ns", "p")),
        Evict("ns", "p", "p-a", "ScaleDown", "Ready"),
        now,
    )
    kube = state.kube
    assert isinstance(kube, RecordingKube)
    [(name, patch)] = kube.pod_patches
    assert name == "p-a" and patch["metadata"]["labels"] == {"modelpool.dev/serving": None}
    annotations = patch["metadata"]["annotations"]
    assert (annotations["modelpool.dev/evicting"], annotations["modelpool.dev/evicted-in-state"]) == (
        "ScaleDown",
        "Ready",
    )


# ---- a ModelHost's pass (reconcile_host) -----------------------------------------------------------------


def _host(replicas: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelHost",
        "metadata": {"name": "gpus", "namespace": "ns", "uid": "uid-gpus", "generation": 1},
        "spec": {"replicas": replicas, "gpusPerHost": 1, "deviceMemory": "2Gi", **spec},
    }


async def test_a_host_pass_makes_its_key_once_and_its_pods_within_the_budget(state: Operator) -> None:
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.host import host_charge_key
    from modelpool_operator.observe.ownership import OwnedPods, host_record
    from modelpool_operator.reconcile_host import reconcile_host

    run, body = HostRun(key=("ns", "gpus")), _host(3)
    budgets = {"default": [{"memory": "5Gi"}]}
    pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
    # As the operator reads the index: its host pods, charged from the ModelHost's spec (``ownership``).
    view = OwnedPods(pods, {host_charge_key("ns", "gpus"): host_record(body)}.get)
    await reconcile_host(
        state.services, state.book, run=run, body=body, pods_by_pool=view, pools_by_key={}, budgets=budgets
    )
    # Two host pods of 2Gi fit the 5Gi budget; the third waits, told once.
    assert sorted(p["metadata"]["name"] for p in state.kube.created) == ["gpus-0", "gpus-1"]
    assert [s["metadata"]["name"] for s in state.kube.secrets] == ["gpus-control-key"]
    assert state.kube.host_status_patches[-1]["readyText"] == "0/3"
    assert [e.reason for _, e in state.events.posted] == ["BudgetExceeded"]
    # The next pass, before the pods are observed: their reservations hold the budget; no second key.
    await reconcile_host(
        state.services, state.book, run=run, body=body, pods_by_pool=view, pools_by_key={}, budgets=budgets
    )
    assert len(state.kube.created) == 2 and len(state.kube.secrets) == 1
    assert [e.reason for _, e in state.events.posted] == ["BudgetExceeded"]
    # Observed: charged as workers, the reservations over; still no room for the third.
    pods[host_charge_key("ns", "gpus")] = [_running(p) for p in state.kube.created]
    await reconcile_host(
        state.services, state.book, run=run, body=body, pods_by_pool=view, pools_by_key={}, budgets=budgets
    )
    assert len(state.kube.created) == 2 and state.book.reservations.reserved == 0


async def test_a_control_key_secret_of_someone_elses_gets_no_host_pod_and_is_retried_with_backoff(
    state: Operator,
) -> None:
    """The Secret's name is someone else's Secret: no host pod (it would mount their key), the key is not
    kept for control calls, ApiError/NameTaken on the ModelHost, one Warning; the Secret is not asked
    again before its delay, and once the name is free the host pods come."""
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.reconcile_host import reconcile_host

    state.kube.foreign.add("gpus-control-key")
    run, body = HostRun(key=("ns", "gpus")), _host(2)

    async def host_pass() -> None:
        await reconcile_host(
            state.services, state.book, run=run, body=body, pods_by_pool={}, pools_by_key={}, budgets={}
        )

    await host_pass()
    await host_pass()
    assert state.kube.created == [] and state.book.reservations.reserved == 0
    assert ("ns", "gpus") not in state.book.control_keys
    assert state.kube.secret_tries == 1, "asked again within its backoff"
    api = _conditions(state.kube.host_status_patches[0])["ApiError"]
    assert (api["status"], api["reason"]) == ("True", "NameTaken")
    assert [e.reason for _, e in state.events.posted] == ["NameTaken"]
    assert run.retry_in is not None and 0 < run.retry_in <= state.services.config.backoff_base_seconds
    # The delay passes with the name still taken: asked again, the next delay doubles.
    run.secret_retry_at = 0.0
    await host_pass()
    assert state.kube.secret_tries == 2 and run.secret_failures == 2 and state.kube.created == []
    assert run.retry_in is not None and run.retry_in > state.services.config.backoff_base_seconds
    # The other Secret is gone: ours is made, then the host pods; the condition clears.
    state.kube.foreign.clear()
    run.secret_retry_at = 0.0
    await host_pass()
    assert sorted(p["metadata"]["name"] for p in state.kube.created) == ["gpus-0", "gpus-1"]
    assert ("ns", "gpus") in state.book.control_keys
    assert _conditions(state.kube.host_status_patches[-1])["ApiError"]["status"] == "False"
    assert [e.reason for _, e in state.events.posted] == ["NameTaken"]


async def test_a_host_pass_fences_its_host_pods_with_a_network_policy_once(state: Operator) -> None:
    """Refused once (a 403): the host pods are made all the same with a Warning Event, the next pass applies
    the policy, and later passes send it no more (each operator start applies the settings again)."""
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.reconcile_host import reconcile_host

    state.use(
        config=OperatorConfig(
            network_policy_enabled=True,
            network_policy_namespace="mp-system",
            network_policy_operator_labels={"app.kubernetes.io/name": "modelpool-operator"},
        )
    )
    state.kube.fail_policies = 1
    run, body = HostRun(key=("ns", "gpus")), _host(1)
    for _ in range(3):
        await reconcile_host(
            state.services, state.book, run=run, body=body, pods_by_pool={}, pools_by_key={}, budgets={}
        )
    assert [p["metadata"]["name"] for p in state.kube.created] == ["gpus-0"]
    [warning] = [e for _, e in state.events.posted if e.reason == "NetworkPolicyFailed"]
    assert "host pods' NetworkPolicy" in warning.message and "403 Forbidden" in warning.message
    [policy] = state.kube.policies
    assert policy["metadata"]["name"] == "modelhost-gpus"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-gpus"


async def test_a_host_with_a_forbidden_image_gets_no_pod_and_one_warning() -> None:
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.reconcile_host import reconcile_host
    from modelpool_operator.refusals import POLICY_VIOLATION

    operator = recording_operator(OperatorConfig(allowed_images=("ghcr.io/modelpool/",)))
    try:
        run, body = HostRun(key=("ns", "gpus")), _host(2, image="docker.io/evil/miner:1")
        for _ in range(2):
            await reconcile_host(
                operator.services,
                operator.book,
                run=run,
                body=body,
                pods_by_pool={},
                pools_by_key={},
                budgets={},
            )
        assert operator.kube.created == []
        [(_, event)] = operator.events.posted
        assert event.reason == POLICY_VIOLATION and "docker.io/evil/miner:1" in event.message
    finally:
        await operator.services.scraper.aclose()


# ---- the shared pools' models on host pods (reconcile_host: observe_host, plan_host_pass, apply_models) ---


class RecordingControl:
    """A ``HostControl`` that records each call (a load answers at once)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.keys: list[str] = []  # the key each unload carried
        self.configs: list[Mapping[str, Any]] = []  # the settings each load carried

    async def index(self, url: str, key: str) -> list[dict[str, Any]]:
        return []

    async def load(self, url: str, key: str, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("load", url, model))
        self.configs.append(config)
        return {"name": model, "state": "Ready"}

    async def unload(self, url: str, key: str, model: str) -> None:
        self.calls.append(("unload", url, model))
        self.keys.append(key)

    async def sleep(self, url: str, key: str, model: str) -> dict[str, Any]:
        self.calls.append(("sleep", url, model))
        return {}

    async def wake(self, url: str, key: str, model: str) -> dict[str, Any]:
        return {}

    async def aclose(self) -> None:
        return None


class CachedStats:
    """A scraper whose cache holds the given stats by pod name (nothing is fetched)."""

    def __init__(self, stats: dict[str, Any], pending: bool = False) -> None:
        self.stats, self.is_pending = stats, pending
        self.invalidated: list[str] = []  # the pods a control call changed, in order

    def invalidate(self, pod: Any) -> None:
        self.invalidated.append(pod["metadata"]["name"])

    def pending(self, pod: Any) -> bool:
        return self.is_pending

    def cached(self, pods: Any) -> dict[str, Any]:
        return {p["metadata"]["name"]: self.stats.get(p["metadata"]["name"]) for p in pods}

    def refresh(self, pods: Any, on_change: Any = None) -> dict[str, Any]:
        return self.cached(pods)

    async def aclose(self) -> None:
        return None


def _host_pod(models: dict[str, str] | None = None) -> dict[str, Any]:
    from modelpool_contract.placements import ANNOTATION_MODELS, models_annotation
    from modelpool_operator.effects.resources import build_host_pod
    from modelpool_operator.host import HostView

    pod = build_host_pod(HostView.from_body(_host(1)), 0)
    if models is not None:
        pod["metadata"]["annotations"][ANNOTATION_MODELS] = models_annotation(models)  # type: ignore[arg-type]
    pod["metadata"]["uid"] = "u-gpus-0"
    pod["status"] = {
        "phase": "Running",
        "podIP": "127.0.0.9",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "server", "ready": True, "state": {"running": {}}}],
    }
    return slim_pod(pod)


def _shared(name: str) -> dict[str, Any]:
    body = _pool(name, 1)
    body["spec"]["host"] = "gpus"
    return body


async def place_models(
    services: Services,
    book: Bookkeeping,
    *,
    run: Any,
    host: Any,
    body: Mapping[str, Any],
    pods_by_pool: Mapping[tuple[str, str], list[dict[str, Any]]],
    pools_by_key: Any,
) -> None:
    """The models half of a ModelHost pass: observed, decided (``plan_host_pass``) and applied
    (``apply_models``), its host pods left as they are."""
    from modelpool_operator.effects.host_models import apply_models
    from modelpool_operator.planner.host_pass import plan_host_pass
    from modelpool_operator.reconcile_host import models_of, observe_host, owned_pods

    owned = owned_pods(host, pods_by_pool)
    observed = observe_host(
        services,
        book,
        run,
        host,
        pods_by_pool=pods_by_pool,
        pools_by_key=pools_by_key,
        budgets={},
        owned=owned,
        now=datetime.now(UTC),
    )
    await apply_models(
        plan_host_pass(observed),
        models_of(services, book, run, host, body=body, pools_by_key=pools_by_key, owned=owned),
    )


def test_a_load_names_the_device_only_on_a_host_pod_of_several_gpus() -> None:
    from modelpool_operator.effects.host_models import load_settings
    from modelpool_operator.planner.host_models import Control

    call = Control(
        "load", "gpus-0", "emb", "placed", json.dumps({"source": "/m", "task": "text-embedding"}), 1
    )
    assert load_settings(call, {"spec": {"gpusPerHost": 2}}) == {
        "source": "/m",
        "task": "text-embedding",
        "device": 1,
    }
    assert "device" not in load_settings(call, {"spec": {"gpusPerHost": 1}})
    assert "device" not in load_settings(call, {"spec": {"gpusPerHost": 0}})


async def test_a_host_pass_loads_a_shared_pool_and_annotates_the_host_pod(state: Operator) -> None:
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.host import HostView, host_charge_key

    control = RecordingControl()
    scraper = CachedStats({"gpus-0": {"models": {}}})
    state.use(host_control=control, scraper=scraper)
    host, body, run = HostView.from_body(_host(1)), _host(1), HostRun(key=("ns", "gpus"))
    pods = {host_charge_key("ns", "gpus"): [_host_pod()]}
    pools = _index({("ns", "emb"): _shared("emb")})

    async def place() -> None:
        await place_models(
            state.services, state.book, run=run, host=host, body=body, pods_by_pool=pods, pools_by_key=pools
        )
        await asyncio.gather(*run.loading.values())

    # Without the control key: no call, one Warning saying why.
    await place()
    await place()
    assert control.calls == []
    assert [e.reason for _, e in state.events.posted] == ["NoControlKey"]
    state.book.control_keys[("ns", "gpus")] = "k"
    await place()
    port = state.services.config.server_probe_port
    assert control.calls == [("load", f"http://127.0.0.9:{port}", "emb")]
    # A host pod of one GPU is not told the device (an older host image refuses the field); the pass
    # keeps the ledger's choice while the load is in flight or landed.
    assert "device" not in control.configs[0] and "device" not in run.loaded[("gpus-0", "emb")]
    assert run.devices == {("gpus-0", "emb"): 0}
    assert run.loaded == {("gpus-0", "emb"): run.loaded[("gpus-0", "emb")]} and run.loading == {}
    assert scraper.invalidated == ["gpus-0"]  # its /stats predates the load: refetched at the next pass
    # The annotation follows the host's /stats, written only when it differs from the pod's.
    assert state.kube.pod_patches == [
        ("gpus-0", {"metadata": {"annotations": {"modelpool.dev/models": "{}"}}})
    ]
    state.use(scraper=CachedStats({"gpus-0": {"models": {"emb": {"state": "Ready"}}}}))
    pods[host_charge_key("ns", "gpus")] = [_host_pod({"emb": "Ready"})]
    await place()
    assert len(control.calls) == 1 and len(state.kube.pod_patches) == 1
    # The pool deleted: unloaded.
    await place_models(
        state.services, state.book, run=run, host=host, body=body, pods_by_pool=pods, pools_by_key={}
    )
    assert control.calls[-1] == ("unload", f"http://127.0.0.9:{port}", "emb")
    # Its /stats refetching (still listing emb, from before the unload): no call until it comes back.
    state.use(scraper=CachedStats({"gpus-0": {"models": {"emb": {"state": "Ready"}}}}, pending=True))
    await place_models(
        state.services, state.book, run=run, host=host, body=body, pods_by_pool=pods, pools_by_key={}
    )
    assert len(control.calls) == 2


async def test_a_pod_merely_labelled_as_a_host_pod_is_never_sent_the_control_key(state: Operator) -> None:
    """Issue 30: a pod with the host pod's label but not owned by the ModelHost's uid (none, or a made-up
    one) gets no control call, so never the ModelHost's key; the owned host pod does."""
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.host import HostView, host_charge_key

    control = RecordingControl()
    state.use(host_control=control, scraper=CachedStats({"gpus-0": {"models": {}}, "fake": {"models": {}}}))
    host, body, run = HostView.from_body(_host(1)), _host(1), HostRun(key=("ns", "gpus"))
    state.book.control_keys[("ns", "gpus")] = "k"
    pools = _index({("ns", "emb"): _shared("emb")})
    for owners in ([], [{**_host_pod()["metadata"]["ownerReferences"][0], "uid": "made-up"}]):
        fake = _host_pod()
        fake["metadata"] = {**fake["metadata"], "name": "fake", "uid": "u-fake", "ownerReferences": owners}
        fake["status"] = {**fake["status"], "podIP": "127.0.0.10"}
        await place_models(
            state.services,
            state.book,
            run=run,
            host=host,
            body=body,
            pods_by_pool={host_charge_key("ns", "gpus"): [fake]},
            pools_by_key=pools,
        )
        await asyncio.gather(*run.loading.values())
        assert control.calls == []
    await place_models(
        state.services,
        state.book,
        run=run,
        host=host,
        body=body,
        pods_by_pool={host_charge_key("ns", "gpus"): [_host_pod()]},
        pools_by_key=pools,
    )
    await asyncio.gather(*run.loading.values())
    assert [call[:2] for call in control.calls] == [
        ("load", f"http://127.0.0.9:{state.services.config.server_probe_port}")
    ]


async def test_a_host_pass_places_no_model_on_a_host_pod_it_deletes(state: Operator) -> None:
    """The ModelHost scaled down to one host pod: gpus-1 is deleted in this pass, so the pool's model is not
    loaded there (it was: the placing did not know the pass deleted the pod, and the load went with it).
    gpus-0's /stats is unknown, so no host pod can take the model now."""
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.host import host_charge_key
    from modelpool_operator.reconcile_host import reconcile_host

    deleted: list[str] = []

    async def delete_pod(namespace: str, name: str, grace_period_seconds: int | None = None) -> bool:
        deleted.append(name)
        return True

    control = RecordingControl()
    state.use(host_control=control, scraper=CachedStats({"gpus-1": {"models": {}}}))
    state.kube.delete_pod = delete_pod  # type: ignore[method-assign]
    state.book.control_keys[("ns", "gpus")] = "k"
    extra = _host_pod()
    extra["metadata"] = {**extra["metadata"], "name": "gpus-1", "uid": "u-gpus-1"}
    extra["status"] = {**extra["status"], "podIP": "127.0.0.11"}
    run = HostRun(key=("ns", "gpus"))
    planned = await reconcile_host(
        state.services,
        state.book,
        run=run,
        body=_host(1),
        pods_by_pool={host_charge_key("ns", "gpus"): [_host_pod(), extra]},
        pools_by_key=_index({("ns", "emb"): _shared("emb")}),
        budgets={},
    )
    await asyncio.gather(*run.loading.values())
    assert "gpus-1" in deleted and control.calls == []
    assert planned is not None and planned.models.unplaced["emb"].reason == "NoHost"


async def test_a_pool_switched_to_a_host_loses_its_dedicated_workers(state: Operator) -> None:
    deleted: list[str] = []

    async def delete_pod(namespace: str, name: str, grace_period_seconds: int | None = None) -> bool:
        deleted.append(name)
        return True

    state.kube.delete_pod = delete_pod  # type: ignore[method-assign]
    body = _shared("emb")
    worker = _running({"metadata": {"name": "emb-abcde-0", "namespace": "ns"}, "spec": {}})
    hosts = {("ns", "gpus"): [_host(1)["spec"]]}
    await OnePool(state, body, budgets={}).reconcile({("ns", "emb"): [worker]}, hosts=hosts)
    assert deleted == ["emb-abcde-0"]
    [patch] = state.kube.status_patches
    assert patch["phase"] == "Pending" and patch["conditions"][0]["reason"] == "NoHost"


async def test_a_pool_switched_to_a_host_removes_its_service_and_budget_once(state: Operator) -> None:
    """A shared pool keeps none of what its dedicated workers had (``dedicated_objects``): its Service and
    PodDisruptionBudget are removed (its own only: by its uid) at its first shared pass, not at every pass;
    switched back to dedicated, both are made again, and a second switch removes them again."""
    body = _pool("emb", 1)
    one = OnePool(state, body)
    await one.reconcile()
    assert [s["metadata"]["name"] for s in state.kube.services] == ["emb"]
    hosts = {("ns", "gpus"): [_host(1)["spec"]]}
    body["spec"]["host"] = "gpus"
    await one.reconcile(hosts=hosts)
    await one.reconcile(hosts=hosts)
    removed = [("Service", "emb", "uid-emb"), ("PodDisruptionBudget", "modelpool-emb", "uid-emb")]
    assert state.kube.owned_deleted == removed
    del body["spec"]["host"]
    await one.reconcile()
    assert len(state.kube.services) == 2 and len(state.kube.budgets) == 2
    body["spec"]["host"] = "gpus"
    await one.reconcile(hosts=hosts)
    assert state.kube.owned_deleted == removed + removed


async def test_after_a_restart_a_model_of_another_source_is_unloaded(state: Operator) -> None:
    """A fresh process does not know what it loaded: what the host reports of the model (its source and
    task in /stats) against the pool's settings tells it."""
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.host import HostView, host_charge_key

    control = RecordingControl()
    doc: dict[str, Any] = {
        "state": "Ready",
        "model": {"name": "emb", "task": "text-embedding", "source": "/models/old"},
    }
    state.use(host_control=control, scraper=CachedStats({"gpus-0": {"models": {"emb": doc}}}))
    state.book.control_keys[("ns", "gpus")] = "k"
    pods = {host_charge_key("ns", "gpus"): [_host_pod({"emb": "Ready"})]}
    pools = _index({("ns", "emb"): _shared("emb")})
    host, run = HostView.from_body(_host(1)), HostRun(key=("ns", "gpus"))
    await place_models(
        state.services, state.book, run=run, host=host, body=_host(1), pods_by_pool=pods, pools_by_key=pools
    )
    assert [(action, model) for action, _, model in control.calls] == [("unload", "emb")]
    doc["model"]["source"] = "/models/m"  # the pool's own: kept
    await place_models(
        state.services, state.book, run=run, host=host, body=_host(1), pods_by_pool=pods, pools_by_key=pools
    )
    assert len(control.calls) == 1


# ---- a shared pool's count, retries and failures (shared_pass, place_models) ------------------------------


async def test_a_shared_pools_pass_hands_its_count_to_its_modelhost_and_writes_it(state: Operator) -> None:
    """The pool's pass decides its count over its model's figures on the host pods (a burst of load here),
    hands it to its ModelHost's pass (which it pokes) and writes it in its status; while autoscaling under
    load it looks again every stats interval, idle only when a decision of its own is due."""
    from modelpool_operator.host import host_charge_key

    doc = {"state": "Processing", "in_flight": 8, "queue_depth": 32, "time": 1.0}
    state.use(scraper=CachedStats({"gpus-0": {"models": {"emb": doc}}}))
    host_key = host_charge_key("ns", "gpus")
    woken = state.book.wakeup(host_key)
    pool, hosts = OnePool(state, _shared("emb"), budgets={}), {("ns", "gpus"): [_host(3)["spec"]]}
    pool.body["spec"]["maxReplicas"] = 5
    plan = await pool.reconcile({host_key: [_host_pod({"emb": "Processing"})]}, hosts=hosts)
    assert plan is not None and plan.requeue_after == state.services.config.stats_interval_seconds
    assert state.book.shared[("ns", "emb")].target == 3 and woken.is_set()
    [patch] = state.kube.status_patches
    assert patch["targetReplicas"] == 4 and patch["specReplicas"] == 1
    assert patch["autoscaling"]["desiredReplicas"] == 4 and patch["autoscaling"]["observedLoad"] == 40
    assert [e.reason for name, e in state.events.posted if name == "emb"] == ["ScaledUp", "EveryHostHoldsIt"]
    idle = {"state": "Idle", "in_flight": 0, "queue_depth": 0, "time": 2.0}
    state.use(scraper=CachedStats({"gpus-0": {"models": {"emb": idle}}}))
    # A fresh run (no load window carried over from the burst).
    quiet = await OnePool(state, pool.body, budgets={}).reconcile(
        {host_key: [_host_pod({"emb": "Idle"})]}, hosts=hosts
    )
    # Idle: only its idle unload (twice the default idleTimeoutSeconds, 300 s) asks for a pass.
    assert quiet is not None and quiet.requeue_after is not None and quiet.requeue_after > 500


async def test_a_pool_switched_to_a_host_drops_its_dedicated_status_fields_once(state: Operator) -> None:
    """Its status from its dedicated days (a selector, a roll-over) is removed by its first shared pass, and
    not again at every pass after (what was written was remembered as the old status with the new on top)."""
    from modelpool_operator.host import host_charge_key

    state.use(scraper=CachedStats({"gpus-0": {"models": {"emb": {"state": "Idle", "time": 1.0}}}}))
    pool = OnePool(state, _shared("emb"), budgets={})
    pool.body["status"] = {"selector": "modelpool.dev/pool=emb", "rollout": {"outdated": 1}, "phase": "Ready"}
    pods = {host_charge_key("ns", "gpus"): [_host_pod({"emb": "Idle"})]}
    for _ in range(3):
        await pool.reconcile(pods, hosts={("ns", "gpus"): [_host(1)["spec"]]})
    first, *later = state.kube.status_patches
    assert (first["selector"], first["rollout"]) == (None, None) and first["workers"][0]["host"] == "gpus-0"
    assert later == []


class FailingControl(RecordingControl):
    """Every unload and sleep is refused by the host."""

    async def unload(self, url: str, key: str, model: str) -> None:
        from modelpool_operator.effects.host_control import ControlError

        raise ControlError("500: the model's process does not answer", 500)


async def test_a_control_call_that_fails_is_told_on_the_pool_as_well_as_the_modelhost(
    state: Operator,
) -> None:
    """Its pool's pass set its count to 0: the unload fails, and both the ModelHost and the pool hear why
    (the pool naming the host pod)."""
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.host import HostView, host_charge_key
    from modelpool_operator.planner.shared_scale import SharedCount

    state.use(
        host_control=FailingControl(), scraper=CachedStats({"gpus-0": {"models": {"emb": {"state": "Idle"}}}})
    )
    state.book.control_keys[("ns", "gpus")] = "k"
    state.book.shared[("ns", "emb")] = SharedCount(0)
    host, run = HostView.from_body(_host(1)), HostRun(key=("ns", "gpus"))
    await place_models(
        state.services,
        state.book,
        run=run,
        host=host,
        body=_host(1),
        pods_by_pool={host_charge_key("ns", "gpus"): [_host_pod({"emb": "Idle"})]},
        pools_by_key=_index({("ns", "emb"): _shared("emb")}),
    )
    told = {name: (e.type, e.reason, e.message) for name, e in state.events.posted}
    assert told["gpus"][:2] == told["emb"][:2] == ("Warning", "UnloadFailed")
    assert told["emb"][2] == "host pod gpus-0: unload failed: 500: the model's process does not answer"
    assert ("gpus-0", "emb") in run.backoff


def test_a_pools_control_failures_of_one_pass_are_one_event_per_reason(state: Operator) -> None:
    from modelpool_operator.effects.host_models import tell_pools

    failed = [
        ("emb", Event("Warning", "UnloadFailed", "host pod gpus-0: unload failed: 500: a")),
        ("emb", Event("Warning", "SleepFailed", "host pod gpus-0: sleep failed: 507: b")),
        ("emb", Event("Warning", "UnloadFailed", "host pod gpus-1: unload failed: 500: c")),
        ("gone", Event("Warning", "UnloadFailed", "host pod gpus-1: unload failed: 500: d")),
    ]
    tell_pools(state.services, {"emb": OtherPool("ns", "emb", 0, 0, uid="u").reference()}, failed)
    assert state.events.posted == [
        (
            "emb",
            Event(
                "Warning",
                "UnloadFailed",
                "host pod gpus-0: unload failed: 500: a; host pod gpus-1: unload failed: 500: c",
            ),
        ),
        ("emb", Event("Warning", "SleepFailed", "host pod gpus-0: sleep failed: 507: b")),
    ]


async def test_a_restarted_operator_derives_the_same_control_key_without_reading_the_secret(
    state: Operator,
) -> None:
    """The key in the Secret is the one derived from the seed; a second process (fresh bookkeeping, the
    Secret already there: its create answers 409) holds the same key without any Secret read (the fake,
    like ``KubeApi``, has no way to read one)."""
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.control_keys import derive_control_key
    from modelpool_operator.effects.hosts import ensure_control_key
    from modelpool_operator.host import HostView

    host = HostView.from_body(_host(1))
    expected = derive_control_key(SEED, "ns", "gpus", "uid-gpus")
    assert (
        await ensure_control_key(state.services, HostRun(key=host.key), host, state.book.control_keys) is None
    )
    assert state.kube.secrets[0]["stringData"] == {"key": expected}
    restarted = Bookkeeping()
    assert (
        await ensure_control_key(state.services, HostRun(key=host.key), host, restarted.control_keys) is None
    )
    assert restarted.control_keys == {("ns", "gpus"): expected} and len(state.kube.secrets) == 1
    assert not hasattr(state.kube, "read_secret_key")


async def test_a_deleted_pool_is_unloaded_with_the_key_derived_from_its_host_pods_owner(
    state: Operator,
) -> None:
    """A restarted operator whose host daemon has not run yet: the key comes from the seed and the uid the
    host pods' owner reference names."""
    from modelpool_operator.control_keys import derive_control_key
    from modelpool_operator.host import host_charge_key
    from modelpool_operator.reconcile_host import unload_deleted_pool

    control = RecordingControl()
    state.use(host_control=control, scraper=CachedStats({"gpus-0": {"models": {"emb": {"state": "Idle"}}}}))
    pod = _host_pod({"emb": "Idle"})
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "modelpool.dev/v1alpha1",
            "kind": "ModelHost",
            "name": "gpus",
            "uid": "uid-gpus",
            "controller": True,
        }
    ]
    refused = await unload_deleted_pool(
        state.services,
        state.book,
        pool=("ns", "emb"),
        host="gpus",
        pods_by_pool={host_charge_key("ns", "gpus"): [pod]},
    )
    assert refused == [] and [c[0] for c in control.calls] == ["unload"]
    assert control.keys == [derive_control_key(SEED, "ns", "gpus", "uid-gpus")]


async def test_an_invalid_modelhost_is_told_once_per_generation_and_touched_not(state: Operator) -> None:
    """A ModelHost the CRD let through but the operator's model refuses: a Warning Event naming the field,
    once per generation (it was a log line only), and no pod, Secret or status written."""
    from modelpool_operator.bookkeeping import HostRun
    from modelpool_operator.reconcile_host import reconcile_host

    run, body = HostRun(key=("ns", "gpus")), _host(1, deviceMemory="0")
    for _ in range(2):
        planned = await reconcile_host(
            state.services, state.book, run=run, body=body, pods_by_pool={}, pools_by_key={}, budgets={}
        )
        assert planned is None
    [(_, event)] = state.events.posted
    assert (event.type, event.reason) == ("Warning", "InvalidSpec") and "deviceMemory" in event.message
    assert state.kube.created == [] and state.kube.secrets == [] and state.kube.host_status_patches == []
    body["metadata"]["generation"] = 2
    await reconcile_host(
        state.services, state.book, run=run, body=body, pods_by_pool={}, pools_by_key={}, budgets={}
    )
    assert len(state.events.posted) == 2
