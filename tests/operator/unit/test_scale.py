"""Per-pass costs that must not grow with the number of pools (bench.controlplane at 1,000 pools): each pass
of one pool may look at its own workers, not at every worker of every pool."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import cast

import kopf
import pytest

from modelpool_operator import handlers as operator_handlers
from modelpool_operator.budget import (
    BudgetLimit,
    PoolCharge,
    ReservationBook,
    build_ledger,
    ledger_from_charges,
)
from modelpool_operator.observe.observation import ChargeCache, LazyOthers, current_ledger
from modelpool_operator.observe.stats import StatsScraper
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import plan
from modelpool_operator.pool import OtherPool, PoolKey
from tests.operator.unit import op_handlers
from tests.operator.unit.op_planner import make_spec, view, w
from tests.operator.unit.op_pods import GI, at


def worker(name: str, pool: str, memory: int = GI) -> ObservedWorker:
    return ObservedWorker(
        name=name, namespace="ns", pool=pool, state="Ready", memory=memory, requested_memory=memory
    )


class ReadCount(list[ObservedWorker]):
    """A pool's observed workers that counts how often they are read."""

    reads = 0

    def __iter__(self) -> Iterator[ObservedWorker]:
        self.reads += 1
        return super().__iter__()


def pools(count: int, per_pool: int) -> dict[PoolKey, list[ObservedWorker]]:
    return {
        ("ns", f"p{i}"): ReadCount(worker(f"p{i}-{j}", f"p{i}") for j in range(per_pool))
        for i in range(count)
    }


def test_a_ledger_reads_each_pools_workers_once_per_observation_of_them() -> None:
    workers = pools(50, 10)
    charges, book = ChargeCache(), ReservationBook()
    for _ in range(20):  # twenty passes of the same pool: the others' lists are the ones last observed
        workers[("ns", "p0")] = ReadCount(worker(f"p0-{j}", "p0") for j in range(10))  # the own pool: anew
        ledger = current_ledger(workers, book, limit=BudgetLimit(total=1000 * GI), charges=charges)
        assert ledger.used == 500 * GI
    assert max(ws.reads for key, ws in workers.items() if key != ("ns", "p0")) == 1  # type: ignore[attr-defined]


def test_the_cached_ledger_is_the_ledger_of_every_worker_with_the_live_reservations() -> None:
    workers = pools(3, 2)
    book = ReservationBook()
    book.reserve("ns", "p1", "p1-0", GI, at(0))  # observed: its pod's charge counts instead
    book.reserve("ns", "p1", "p1-new", 3 * GI, at(0))  # not observed yet: reserved
    book.reserve("ns", "gone", "gone-0", 5 * GI, at(0))  # a pool with no workers indexed: reserved
    expected = build_ledger(20 * GI, [w for ws in workers.values() for w in ws], book.all(), invalid=None)
    cached = current_ledger(workers, book, limit=BudgetLimit(total=20 * GI), charges=ChargeCache())
    assert (cached.used, cached.reserved, dict(cached.shares)) == (
        expected.used,
        expected.reserved,
        dict(expected.shares),
    )
    assert sorted(r.worker for r in cached.reservations) == ["gone-0", "p1-new"]
    assert sorted(r.worker for r in book.all()) == ["gone-0", "p1-new"]  # the observed one is dropped


def test_a_pool_observed_anew_is_summed_anew_and_a_pool_gone_is_forgotten() -> None:
    charges = ChargeCache()
    workers = pools(2, 2)
    assert current_ledger(workers, ReservationBook(), limit=BudgetLimit(), charges=charges).used == 4 * GI
    workers[("ns", "p1")] = [worker("p1-0", "p1", 3 * GI)]
    assert current_ledger(workers, ReservationBook(), limit=BudgetLimit(), charges=charges).used == 5 * GI
    del workers[("ns", "p1")]
    ledger = current_ledger(workers, ReservationBook(), limit=BudgetLimit(), charges=charges)
    assert (ledger.used, dict(ledger.shares)) == (2 * GI, {("ns", "p0"): 2 * GI})


def test_a_pass_with_nothing_to_admit_never_builds_the_other_pools() -> None:
    others = LazyOthers(lambda: [OtherPool(namespace="ns", name="q", priority=0, min_replicas=0)])
    ready = [w("a"), w("b")]  # spec.replicas 2: at its target
    decided = plan(view(), ready, build_ledger(100 * GI, ready), now=at(100), others=others)
    assert decided.create == () and not others.built


def test_a_pass_that_admits_within_a_budget_reads_the_other_pools() -> None:
    others = LazyOthers(lambda: [OtherPool(namespace="ns", name="q", priority=0, min_replicas=0)])
    decided = plan(view(), [w("a")], build_ledger(100 * GI, [w("a")]), now=at(100), others=others)
    assert len(decided.create) == 1 and others.built and [o.name for o in others] == ["q"]


def test_a_pass_that_admits_without_a_budget_never_builds_the_other_pools() -> None:
    # Without a ModelBudget every worker fits: what other pools wait for does not matter. The list of a
    # thousand pools was built for each pool's first pass of a scale-up (18 % of the operator at 1,000).
    others = LazyOthers(lambda: [OtherPool(namespace="ns", name="q", priority=9, min_replicas=0)])
    decided = plan(view(), [w("a")], build_ledger(None, [w("a")]), now=at(100), others=others)
    assert len(decided.create) == 1 and not others.built


class CountedKeys(frozenset[tuple[str, str]]):
    """A pool's observed worker keys that count the lookups made in them."""

    lookups = 0

    def __contains__(self, key: object) -> bool:
        CountedKeys.lookups += 1
        return super().__contains__(key)


def test_a_ledger_looks_at_reservations_only_of_pools_observed_anew() -> None:
    book = ReservationBook()
    charges = {("ns", f"p{i}"): PoolCharge(used=0, keys=CountedKeys()) for i in range(1000)}
    for i in range(1000):
        for j in range(10):  # every pool scaling up at once: 10,000 pods not observed yet
            book.reserve("ns", f"p{i}", f"p{i}-{j}", GI, at(0))
    first = ledger_from_charges(None, charges, book)
    assert first.reserved == 10_000 * GI and len(first.reservations_of(("ns", "p7"))) == 10
    CountedKeys.lookups = 0
    charges[("ns", "p7")] = PoolCharge(used=GI, keys=CountedKeys({("ns", "p7-0")}))  # p7 observed anew
    second = ledger_from_charges(None, charges, book)
    assert CountedKeys.lookups == 10  # p7's reservations, not the 10,000
    assert second.reserved == 9_999 * GI and len(second.reservations_of(("ns", "p7"))) == 9
    assert len(first.reservations_of(("ns", "p7"))) == 10  # an earlier ledger is not changed by the book


def test_due_hands_out_each_answered_reservation_once_per_check_period() -> None:
    book = ReservationBook()
    book.reserve("ns", "p", "a", GI, at(0))
    book.reserve("ns", "p", "b", GI, at(0))
    book.answered("ns", "a", at(1), 60)
    assert book.due(at(30), 60) == ()
    assert [r.worker for r in book.due(at(61), 60)] == ["a"]
    assert book.due(at(62), 60) == ()  # asked again only a period later
    assert [r.worker for r in book.due(at(121), 60)] == ["a"]
    book.answered("ns", "b", at(122), 60)
    assert sorted(r.worker for r in book.due(at(200), 60)) == ["a", "b"]


def test_the_scraper_looks_for_forgotten_pods_once_a_minute_not_at_every_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("modelpool_operator.observe.stats.time.monotonic", lambda: clock[0])

    def pod(name: str) -> dict[str, object]:  # no address yet: nothing is fetched
        return {"metadata": {"name": name, "uid": name}, "status": {"phase": "Pending"}}

    async def passes() -> list[int]:
        scraper = StatsScraper(interval=5, timeout=1, concurrency=1, backoff_cap=30, default_port=8000)
        scraper.refresh([pod(f"other-{i}") for i in range(1000)])  # another pool's, then gone
        sizes = []
        for second in (590, 601, 630, 651):  # the own pool's passes; the others were last asked at 0
            clock[0] = 1000.0 + second
            scraper.refresh([pod("own")])
            sizes.append(len(scraper._entries))
        await scraper.aclose()
        return sizes

    # A sweep at 590 (nothing 600 s old yet), the next one a minute later: the passes between look at their
    # own pods only (the others, stale since 600, wait for it).
    assert asyncio.run(passes()) == [1001, 1001, 1001, 1]


def test_every_watch_handler_runs_on_the_event_loop_not_in_kopfs_thread_pool() -> None:
    # Kopf runs a plain function in a thread pool: a thread hop and a GIL wait per watch event (a few
    # hundred pod events a minute at 300 pools), and asyncio Events set from another thread.
    assert operator_handlers.__name__  # importing it registers the handlers
    registry = kopf.get_default_registry()
    handlers = [
        *registry._indexing.get_all_handlers(),
        *registry._watching.get_all_handlers(),
        *registry._activities.get_all_handlers(),
    ]
    names = {
        h.fn.__name__: inspect.iscoroutinefunction(h.fn)
        for h in handlers
        if h.fn.__module__ == operator_handlers.__name__
    }
    assert {"pods_by_pool", "pools_by_key", "pod_changed", "pool_changed", "demand_by_pool"} <= names.keys()
    assert [name for name, is_async in names.items() if not is_async] == []


class NoCopy:
    """A value that must not be copied (Kopf's stock storage deep-copies the whole body, status too)."""

    def __deepcopy__(self, memo: object) -> NoCopy:
        raise AssertionError("the essence copied a part of the body it does not keep")


def worker_pod_body() -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p-abcde-0",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "7",
            "labels": {"modelpool.dev/pool": "p", "app": "x"},
            "annotations": {
                "modelpool.dev/memory": "1Gi",
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "other.kopf.zalando.org/last-handled-configuration": "{}",
                "modelpool.dev/last-handled-configuration": "{}",
            },
            "managedFields": [{"manager": "kwok", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"containers": [{"name": "server", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def kopf_body(raw: Mapping[str, object]) -> kopf.Body:
    """A test's object as Kopf wraps the body of a watch event (Kopf types what it wraps as its TypedDict)."""
    return kopf.Body(cast(kopf.RawBody, raw))


def pool_like_body() -> dict[str, object]:
    """The worker pod's body as an object of a kind with change-detecting handlers (a pod's essence is {})."""
    return {**worker_pod_body(), "apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelPool"}


def test_a_pods_essence_is_empty_and_copies_nothing() -> None:
    # No handler of the operator detects changes of pods (an index and an event handler read the body): a
    # copy of each pod's spec at each of its watch events bought nothing (10,000 pods at 1,000 pools).
    from kopf._cogs.structs.references import Resource

    from modelpool_operator.settings import OperatorConfig, apply_to_kopf

    pods = Resource(group="", version="v1", plural="pods")
    registry = kopf.get_default_registry()
    assert registry._indexing.has_handlers(resource=pods) and registry._watching.has_handlers(resource=pods)
    assert not registry._changing.has_handlers(resource=pods)
    assert not registry._spawning.has_handlers(resource=pods)
    settings = kopf.OperatorSettings()
    apply_to_kopf(OperatorConfig(), settings)
    body = worker_pod_body()
    body["spec"] = {"containers": [NoCopy()]}
    assert settings.persistence.diffbase_storage.build(body=kopf_body(body)) == {}


def test_the_essence_kopf_builds_at_each_watch_event_copies_neither_status_nor_managed_fields() -> None:
    # Kopf's own AnnotationsDiffBaseStorage deep-copies the whole body at every watch event of every watched
    # object (a fifth of the operator's CPU at 150 pools x 10 workers in a profile); the same essence is made
    # from the parts it keeps.
    import json

    from modelpool_contract.labels import PREFIX
    from modelpool_operator.settings import OperatorConfig, apply_to_kopf

    settings = kopf.OperatorSettings()
    apply_to_kopf(OperatorConfig(), settings)
    storage = settings.persistence.diffbase_storage
    stock = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration")
    for raw in (pool_like_body(), {"apiVersion": "v1", "kind": "ModelPool", "metadata": {"name": "bare"}}):
        assert storage.build(body=kopf_body(raw)) == stock.build(body=kopf_body(raw))
    body = pool_like_body()
    expected = stock.build(body=kopf_body(json.loads(json.dumps(body))))
    body["status"] = {"phase": "Running", "huge": NoCopy()}
    body["metadata"]["managedFields"] = [NoCopy()]  # type: ignore[index]
    assert storage.build(body=kopf_body(body)) == expected


def test_a_pools_own_status_write_does_not_wake_it_again_a_spec_change_does() -> None:
    # Every status patch comes back as a watch event of the pool; each woke the pool for one more pass (the
    # pass reads the status it wrote itself), doubling the passes of a scale-up.
    from modelpool_operator.bookkeeping import Bookkeeping
    from modelpool_operator.settings import OperatorConfig

    memo = operator_handlers.make_memo(OperatorConfig())
    book: Bookkeeping = memo.book
    pool_memo = kopf.Memo(memo)  # Kopf's per-object copy of the operator's memo
    woken = book.wakeup(("ns", "p"))

    async def event(kind: str | None, generation: int, **meta: object) -> bool:
        woken.clear()
        meta = {"generation": generation, **meta}
        await op_handlers.pool_changed(
            type=kind, namespace="ns", name="p", meta=meta, body={"metadata": meta}, memo=pool_memo
        )
        return woken.is_set()

    async def events() -> list[bool]:
        return [
            await event(None, 1),  # listed at start
            await event("MODIFIED", 1),  # its own status write
            await event("MODIFIED", 1),
            await event("MODIFIED", 2),  # the spec edited
            await event("MODIFIED", 2),
            await event("MODIFIED", 2, deletionTimestamp="2026-01-01T00:00:00Z"),
        ]

    assert asyncio.run(events()) == [True, False, False, True, False, True]


def test_whether_a_pool_event_needs_a_pass() -> None:
    assert operator_handlers.spec_changed("ADDED", {"generation": 1}, (1, None))
    assert operator_handlers.spec_changed("MODIFIED", {"generation": 1}, None)  # first sight
    assert not operator_handlers.spec_changed("MODIFIED", {"generation": 1}, (1, None))


def test_a_pod_that_refuses_connections_is_asked_rarely_until_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # KWOK pods have no server behind their address: every scrape is a refused connection. With the timeouts'
    # 30 s cap, 3,000 such pods cost 100 refused connections a second (a sixth of the operator's CPU).
    from testkit.environment import free_port

    clock = [1000.0]
    monkeypatch.setattr("modelpool_operator.observe.stats.time.monotonic", lambda: clock[0])
    port = free_port()  # nothing listens there: each attempt is refused at once

    def pod(version: str) -> dict[str, object]:
        return {
            "metadata": {"name": "kwok-0", "uid": "u", "resourceVersion": version},
            "spec": {"containers": [{"ports": [{"name": "probes", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
        }

    async def attempts() -> tuple[int, int]:
        scraper = StatsScraper(interval=5, timeout=1, concurrency=4, backoff_cap=30, default_port=port)
        for step in range(0, 1200, 5):  # twenty minutes of passes every 5 s
            clock[0] = 1000.0 + step
            assert (await scraper.scrape([pod("1")])) == {"kwok-0": None}
        within_twenty_minutes = scraper._entries["u"].failures
        await scraper.scrape([pod("2")])  # the pod changed (e.g. became ready): asked at once
        after_change = scraper._entries["u"].failures - within_twenty_minutes
        await scraper.aclose()
        return within_twenty_minutes, after_change

    refused, after_change = asyncio.run(attempts())
    assert refused <= 7, refused  # after 5, 20, 80 s, then every 300 s (42 with the timeouts' 30 s cap)
    assert after_change == 1


def test_a_pass_tells_one_normal_event_per_reason_and_every_warning() -> None:
    from modelpool_operator.planner import Event
    from modelpool_operator.planner.status import MAX_MESSAGE_CHARS, coalesce

    told = [
        Event("Normal", "WorkerReady", "worker a is ready"),
        Event("Warning", "OOMKilled", "worker b failed: OOMKilled"),
        Event("Normal", "WorkerReady", "worker c is ready"),
        Event("Warning", "OOMKilled", "worker d failed: OOMKilled"),
        Event("Normal", "CreatingWorker", "creating worker e"),
    ]
    assert coalesce(told) == [
        Event("Normal", "WorkerReady", "worker a is ready; worker c is ready"),
        told[1],
        told[3],
        Event("Normal", "CreatingWorker", "creating worker e"),
    ]
    many = coalesce(Event("Normal", "CreatingWorker", f"creating worker pool-{i:04d}") for i in range(200))
    assert len(many) == 1 and len(many[0].message) <= MAX_MESSAGE_CHARS
    assert many[0].message.startswith("creating worker pool-0000; creating worker pool-0001;")
    assert many[0].message.endswith(" more") and "pool-0199" not in many[0].message


def test_a_scale_up_of_ten_workers_is_one_creating_event() -> None:
    decided = plan(view(make_spec(replicas=10, maxReplicas=10)), [], build_ledger(100 * GI, []), now=at(100))
    assert len(decided.create) == 10
    assert [e.reason for e in decided.events].count("CreatingWorker") == 1


def test_an_idle_pool_passes_at_the_resync_interval_and_refreshes_its_stats_in_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pass every stats interval per pool (30 a second at 150 pools, most deciding nothing) cost half the
    # operator's CPU at steady state; its workers' stats are refreshed without a pass instead (news wakes it).
    from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

    from modelpool_operator.metrics import OperatorMetrics
    from modelpool_operator.observe.observation import ObservationCache
    from modelpool_operator.observe.ownership import OwnerRecord
    from modelpool_operator.services import Services, lifecycle_settings
    from modelpool_operator.settings import OperatorConfig

    class CountingScraper(StatsScraper):
        refreshes = 0

        def refresh(self, pods, on_change=None):  # type: ignore[no-untyped-def]
            CountingScraper.refreshes += 1
            return super().refresh(pods, on_change)

    passes: list[float] = []

    async def one_pass(*args: object, **kwargs: object) -> None:
        passes.append(asyncio.get_running_loop().time())

    monkeypatch.setattr(operator_handlers, "reconcile_pool", one_pass)

    async def run_daemon() -> tuple[int, int, int]:
        config = OperatorConfig(stats_interval_seconds=0.05, resync_interval_seconds=0.6)
        memo = operator_handlers.make_memo(config)
        scraper = CountingScraper(interval=0.05, timeout=1, concurrency=1, backoff_cap=1, default_port=8000)
        memo.services = Services(  # the passes are counted, not run: no API client, no Event sink
            config=config,
            kube=None,  # type: ignore[arg-type]
            scraper=scraper,
            observations=ObservationCache(lifecycle_settings(config)),
            events=None,  # type: ignore[arg-type]
            metrics=OperatorMetrics(),
            host_control=None,  # type: ignore[arg-type]
            control_seed=b"0" * 32,
        )
        setter: FlagSetter[kopf.DaemonStoppingReason] = FlagSetter()
        owner = {
            "apiVersion": "modelpool.dev/v1alpha1",
            "kind": "ModelPool",
            "name": "p",
            "uid": "u",
            "controller": True,
        }
        meta = {"name": "w", "uid": "w", "ownerReferences": [owner]}
        pods = {("ns", "p"): [{"metadata": meta, "status": {"phase": "Pending"}}]}
        daemon = asyncio.create_task(
            op_handlers.pool_daemon(
                namespace="ns", name="p", body={}, memo=memo, logger=logging.getLogger("t"),
                stopped=AsyncFlagWaiter(setter), pods_by_pool=pods, pools_by_key={},
                budgets_by_name={}, demand_by_pool={}, hosts_by_key={},
                pool_owners={("ns", "p"): [OwnerRecord("u")]}, host_owners={},
            )
        )  # fmt: skip
        await asyncio.sleep(1.5)
        idle_passes = len(passes)
        memo.book.poke(("ns", "p"))  # a pod event: a pass at once (after the 0.3 s coalescing)
        await asyncio.sleep(0.45)
        setter.set()
        await asyncio.wait_for(daemon, 5)
        await scraper.aclose()
        return idle_passes, len(passes) - idle_passes, CountingScraper.refreshes

    idle_passes, woken_passes, refreshes = asyncio.run(run_daemon())
    assert idle_passes <= 3, idle_passes  # at 0, 0.6, 1.2 s (30 with a pass every stats interval)
    assert woken_passes >= 1
    assert refreshes >= 15  # the stats every 0.05 s in between


def services_for(config: object, kube: object = None, scraper: object = None) -> object:
    """The process's services with only what a test looks at (the others unused: None)."""
    from modelpool_operator.metrics import OperatorMetrics
    from modelpool_operator.observe.observation import ObservationCache
    from modelpool_operator.services import Services, lifecycle_settings

    return Services(
        config=config,  # type: ignore[arg-type]
        kube=kube,  # type: ignore[arg-type]
        scraper=scraper,  # type: ignore[arg-type]
        observations=ObservationCache(lifecycle_settings(config)),  # type: ignore[arg-type]
        events=None,  # type: ignore[arg-type]
        metrics=OperatorMetrics(),
        host_control=None,  # type: ignore[arg-type]
        control_seed=b"0" * 32,
    )


def test_at_most_k_passes_run_at_once_and_a_pool_poked_while_queued_gets_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At 1,000 pools every pool was woken at once: ~1,000 passes in flight, each holding its observation of
    # every pool while its requests queued (141,000 ObservedWorkers alive for 10,000 pods).
    from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

    from modelpool_operator.bookkeeping import PassGate
    from modelpool_operator.settings import OperatorConfig

    active, peak = 0, 0
    passes: dict[PoolKey, int] = {}
    hold = asyncio.Event()  # set: passes are let through at once; clear: they wait for it

    async def one_pass(*args: object, run: object, **kwargs: object) -> None:
        nonlocal active, peak
        key = run.key  # type: ignore[attr-defined]
        passes[key] = passes.get(key, 0) + 1
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        await hold.wait()
        active -= 1

    monkeypatch.setattr(operator_handlers, "reconcile_pool", one_pass)

    async def until(condition: Callable[[], bool], what: str) -> None:
        for _ in range(1000):  # 10 s at most
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"not reached: {what}")

    async def run_daemons() -> None:
        config = OperatorConfig(stats_interval_seconds=60, resync_interval_seconds=60)
        memo = operator_handlers.make_memo(config)
        memo.book.passes = PassGate(2)
        scraper = StatsScraper(interval=60, timeout=1, concurrency=1, backoff_cap=1, default_port=8000)
        memo.services = services_for(config, scraper=scraper)
        setter: FlagSetter[kopf.DaemonStoppingReason] = FlagSetter()
        keys = [("ns", f"p{i}") for i in range(6)]
        hold.set()
        daemons = [
            asyncio.create_task(
                op_handlers.pool_daemon(
                    namespace=ns, name=name, body={}, memo=memo, logger=logging.getLogger("t"),
                    stopped=AsyncFlagWaiter(setter), pods_by_pool={}, pools_by_key={},
                    budgets_by_name={}, demand_by_pool={}, hosts_by_key={},
                    pool_owners={}, host_owners={},
                )
            )
            for ns, name in keys
        ]  # fmt: skip
        await until(lambda: len(passes) == 6 and active == 0, "every pool's first pass")
        assert peak == 2  # six pools started together, two passes at a time

        hold.clear()  # p0 and p1 take both slots and keep them
        memo.book.poke(keys[0])
        memo.book.poke(keys[1])
        await until(lambda: active == 2, "two passes holding the slots")
        for _ in range(5):  # p2 is poked again and again while it waits for a slot
            memo.book.poke(keys[2])
            await asyncio.sleep(0.1)
        assert memo.book.passes.waiting == 1 and passes[keys[2]] == 1
        hold.set()
        await until(lambda: passes[keys[2]] == 2 and active == 0, "p2's pass")
        await asyncio.sleep(0.5)  # longer than the coalescing: a second queued pass would have run
        assert passes == {keys[0]: 2, keys[1]: 2, keys[2]: 2, keys[3]: 1, keys[4]: 1, keys[5]: 1}
        assert peak == 2
        setter.set()
        await asyncio.wait_for(asyncio.gather(*daemons), 5)
        await scraper.aclose()

    asyncio.run(run_daemons())


class CheckingKube:
    """``pod_exists`` that counts the questions and those in flight at once; every pod is absent."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.active = 0
        self.peak = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def pod_exists(self, namespace: str, name: str) -> bool:
        self.asked.append(name)
        self.active += 1
        self.peak = max(self.peak, self.active)
        await self.gate.wait()
        await asyncio.sleep(0)
        self.active -= 1
        return False


def due_book(book: ReservationBook, count: int, now: datetime, check_s: float = 60) -> None:
    for i in range(count):
        book.reserve("ns", f"p{i % 50}", f"w{i}", GI, now)
        book.answered("ns", f"w{i}", now, check_s)


def test_due_reservations_are_asked_about_in_bounded_batches_the_indexed_ones_never() -> None:
    # At 1,000 pools the pods watch lagged: thousands of reservations went due at once, and every pass asked
    # the API about its share of them, one after the other, with its pass (and what it held) in flight.
    from modelpool_operator.bookkeeping import Bookkeeping
    from modelpool_operator.effects.apply import SETTLE_BATCH, SETTLE_CONCURRENCY, settle_reservations
    from modelpool_operator.settings import OperatorConfig

    async def settle() -> None:
        kube, book = CheckingKube(), Bookkeeping()
        services = services_for(OperatorConfig(reservation_ttl_seconds=60), kube=kube)
        start = datetime.now(UTC)
        due_book(book.reservations, 500, start)
        later = start + timedelta(seconds=61)
        watched = {f"w{i}" for i in range(0, 500, 2)}  # the index shows every other pod
        await settle_reservations(services, book, later, indexed=lambda r: r.worker in watched)  # type: ignore[arg-type]
        assert len(kube.asked) == SETTLE_BATCH and not watched & set(kube.asked)
        assert kube.peak <= SETTLE_CONCURRENCY
        await settle_reservations(services, book, later, indexed=lambda r: r.worker in watched)  # type: ignore[arg-type]
        assert len(kube.asked) == 2 * SETTLE_BATCH and len(set(kube.asked)) == 2 * SETTLE_BATCH
        await settle_reservations(services, book, later, indexed=lambda r: r.worker in watched)  # type: ignore[arg-type]
        assert len(kube.asked) == 250  # every unwatched one asked once; the watched ones never
        assert (
            len(book.reservations) == 250
        )  # the absent ones ended; the watched ones stay (their pass ends them)

    asyncio.run(settle())


def test_passes_ending_together_start_one_settle_task_and_never_wait_for_it() -> None:
    from modelpool_operator.bookkeeping import Bookkeeping
    from modelpool_operator.effects.apply import SETTLE_CONCURRENCY, settle_soon
    from modelpool_operator.settings import OperatorConfig

    async def settle() -> None:
        kube, book = CheckingKube(), Bookkeeping()
        services = services_for(OperatorConfig(reservation_ttl_seconds=0.01), kube=kube)
        due_book(book.reservations, 10, datetime.now(UTC) - timedelta(seconds=1), check_s=0)
        kube.gate.clear()  # the API does not answer yet
        for _ in range(20):  # twenty passes end: none waits, one task asks
            settle_soon(services, book, indexed=lambda _: False)  # type: ignore[arg-type]
        task = book.settle_task
        assert task is not None
        await asyncio.sleep(0.05)
        assert len(kube.asked) == SETTLE_CONCURRENCY and not task.done()  # the rest wait their turn
        kube.gate.set()
        await asyncio.wait_for(task, 5)
        assert len(book.reservations) == 0 and len(kube.asked) == 10

    asyncio.run(settle())


def test_resync_passes_of_many_idle_pools_are_spread_over_the_process_wide_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At 1,000 pools a resync every 10 s was 100 passes a second on the event loop that also runs Kopf's
    # watches: the pods watch fell minutes behind. Resyncs take turns (4 a second here); an event does not.
    from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

    from modelpool_operator.bookkeeping import PassGate
    from modelpool_operator.settings import OperatorConfig

    passes: dict[PoolKey, int] = {}

    async def one_pass(*args: object, run: object, **kwargs: object) -> None:
        key = run.key  # type: ignore[attr-defined]
        passes[key] = passes.get(key, 0) + 1

    monkeypatch.setattr(operator_handlers, "reconcile_pool", one_pass)

    async def run_daemons() -> tuple[int, int]:
        config = OperatorConfig(stats_interval_seconds=60, resync_interval_seconds=0.05)
        memo = operator_handlers.make_memo(config)
        memo.book.passes = PassGate(32, resyncs_per_second=4)
        scraper = StatsScraper(interval=60, timeout=1, concurrency=1, backoff_cap=1, default_port=8000)
        memo.services = services_for(config, scraper=scraper)
        setter: FlagSetter[kopf.DaemonStoppingReason] = FlagSetter()
        daemons = [
            asyncio.create_task(
                op_handlers.pool_daemon(
                    namespace="ns", name=f"p{i}", body={}, memo=memo, logger=logging.getLogger("t"),
                    stopped=AsyncFlagWaiter(setter), pods_by_pool={}, pools_by_key={},
                    budgets_by_name={}, demand_by_pool={}, hosts_by_key={},
                    pool_owners={}, host_owners={},
                )
            )
            for i in range(20)
        ]  # fmt: skip
        await asyncio.sleep(1.0)
        resyncs = sum(passes.values())
        # An event: its pass comes at once (after the 0.3 s coalescing), not at its turn (4 a second for
        # 20 pools: each pool's turn comes every 5 s).
        before = passes[("ns", "p7")]
        memo.book.poke(("ns", "p7"))
        for _ in range(80):  # 0.8 s at most
            if passes[("ns", "p7")] > before:
                break
            await asyncio.sleep(0.01)
        woken = passes[("ns", "p7")] - before
        setter.set()
        await asyncio.wait_for(asyncio.gather(*daemons), 5)
        await scraper.aclose()
        return resyncs, woken

    resyncs, woken = asyncio.run(run_daemons())
    # 20 first passes, then at most 4 resyncs a second (without turns: 20 pools x 20 a second = 400).
    assert 20 <= resyncs <= 20 + 4 * 1.0 + 2, resyncs
    assert woken >= 1


def test_resync_turns_are_handed_out_apart() -> None:
    from modelpool_operator.bookkeeping import PassGate

    gate = PassGate(resyncs_per_second=10)
    assert [round(gate.resync_wait(100.0), 3) for _ in range(4)] == [0.0, 0.1, 0.2, 0.3]
    assert gate.resync_wait(200.0) == 0.0  # long after: its turn is now


def test_the_index_and_watch_handlers_successes_are_not_logged() -> None:
    # One INFO line per watch event ("Handler 'pod_changed' succeeded."), formatted and written: tens of
    # thousands in a 1,000-pool scale-up, saying nothing.
    operator_handlers.quiet_watch_handlers()
    objects = logging.getLogger("kopf.objects")

    def record(level: int, msg: str) -> logging.LogRecord:
        return objects.makeRecord("kopf.objects", level, __file__, 1, msg, (), None)

    assert not objects.filter(record(logging.INFO, "Handler 'pod_changed' succeeded."))
    assert not objects.filter(record(logging.INFO, "Indexer 'pods_by_pool' succeeded."))
    assert objects.filter(record(logging.INFO, "Handler 'shared_pool_deleted' succeeded."))
    assert objects.filter(record(logging.ERROR, "Handler 'pod_changed' failed with an exception."))


class CountedIndex(Mapping[PoolKey, list[dict[str, object]]]):
    """A pods index (as Kopf's: a Mapping) that counts the pools read out of it."""

    def __init__(self, items: dict[PoolKey, list[dict[str, object]]]) -> None:
        self.items_ = items
        self.reads = 0

    def __getitem__(self, key: PoolKey) -> list[dict[str, object]]:
        self.reads += 1
        return self.items_[key]

    def __iter__(self) -> Iterator[PoolKey]:
        return iter(self.items_)

    def __len__(self) -> int:
        return len(self.items_)


def test_a_pass_reads_only_its_own_pool_out_of_the_pods_index() -> None:
    # Every pass looked up every pool of the index (a Python loop over a thousand per pass, a tenth of the
    # operator at 1,000 pools); the other daemons' observations are taken whole instead.
    from modelpool_operator.observe.observation import ObservationCache, observe_all
    from modelpool_operator.observe.worker_state import LifecycleSettings

    def pod(pool: int, i: int) -> dict[str, object]:
        meta = {"name": f"p{pool}-{i}", "namespace": "ns", "uid": f"u{pool}-{i}", "resourceVersion": "1"}
        return {"metadata": meta, "status": {"phase": "Pending"}}

    index = CountedIndex({("ns", f"p{p}"): [pod(p, i) for i in range(3)] for p in range(200)})
    observed: dict[PoolKey, list[ObservedWorker]] = {}
    cache, now = ObservationCache(LifecycleSettings()), datetime.now(UTC)
    for key in list(index.items_):  # every pool's daemon has passed once
        observe_all(
            cache, index, observed=observed, cached_stats=lambda _: {}, own=key, own_stats={}, now=now
        )
    index.reads = 0
    workers = observe_all(
        cache, index, observed=observed, cached_stats=lambda _: {}, own=("ns", "p5"), own_stats={}, now=now
    )
    assert index.reads <= 2, index.reads  # the own pool (200 before)
    assert len(workers) == 200 and all(len(ws) == 3 for ws in workers.values())
    assert workers[("ns", "p6")] is observed[("ns", "p6")]
