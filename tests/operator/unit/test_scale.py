"""Per-pass costs that must not grow with the number of pools (bench.controlplane at 1,000 pools): each pass
of one pool may look at its own workers, not at every worker of every pool."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator

import kopf
import pytest
from op_planner import view, w
from op_pods import GI, at

from modelpool_operator import handlers as operator_handlers
from modelpool_operator.budget import (
    BudgetLimit,
    PoolCharge,
    ReservationBook,
    build_ledger,
    ledger_from_charges,
)
from modelpool_operator.observe import stats
from modelpool_operator.observe.observation import ChargeCache, LazyOthers, current_ledger
from modelpool_operator.observe.stats import StatsScraper
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import plan
from modelpool_operator.pool import OtherPool, PoolKey


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


def test_a_pass_that_admits_reads_the_other_pools() -> None:
    others = LazyOthers(lambda: [OtherPool(namespace="ns", name="q", priority=0, min_replicas=0)])
    decided = plan(view(), [w("a")], build_ledger(100 * GI, [w("a")]), now=at(100), others=others)
    assert len(decided.create) == 1 and others.built and [o.name for o in others] == ["q"]


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
    monkeypatch.setattr(stats.time, "monotonic", lambda: clock[0])

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
