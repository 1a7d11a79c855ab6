"""Fair shares of a full pool (issue 34 item 3): the scheduler's shares, starvation and bounds (properties),
the slots handed out as requests end, the key Secret's weight and priority, and the hold by priority."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from modelpool_gateway.fairness import EQUAL_SHARE, FairQueues, FairScheduler, Share, Slot, pool_capacity
from modelpool_gateway.hold import Holds, queue_position
from modelpool_gateway.keys import KeyStore, parse_share, token_digest
from modelpool_gateway.state import Key, Pool

POOL: Key = ("ns", "pool")
weights = st.lists(st.integers(1, 8), min_size=1, max_size=5)


@given(weights, st.integers(1, 40))
def test_under_backlog_each_key_is_served_in_proportion_to_its_weight(ws: list[int], rounds: int) -> None:
    """Every key always has work waiting: after any n pops, any two keys' counts over their weights differ
    by at most 1/w_i + 1/w_j (start-time fair queuing's bound); after rounds * sum(w), exactly in
    proportion."""
    scheduler: FairScheduler[int] = FairScheduler(max_per_key=10**6, max_total=10**6)
    for key, weight in enumerate(ws):
        for _ in range(rounds * weight + 2):
            assert scheduler.push(key, key, weight) is None
    served: Counter[int] = Counter()
    for _ in range(rounds * sum(ws)):
        item = scheduler.pop()
        assert item is not None
        served[item] += 1
        for i, wi in enumerate(ws):
            for j, wj in enumerate(ws):
                assert served[i] / wi - served[j] / wj <= 1 / wi + 1 / wj + 1e-9, (dict(served), ws)
    assert served == Counter({key: rounds * weight for key, weight in enumerate(ws)})


@given(weights, st.data())
def test_no_key_starves_while_others_keep_sending(ws: list[int], data: st.DataObject) -> None:
    """Key 0 sends one request; however the others keep refilling, it is served within a bounded number
    of pops: every other key's tags pass its head's (at most sum(weights) / its weight pops)."""
    scheduler: FairScheduler[str] = FairScheduler(max_per_key=10**6, max_total=10**6)
    others = list(enumerate(ws, start=1))
    for key, weight in others:  # a backlog before it arrives
        for _ in range(data.draw(st.integers(0, 20))):
            scheduler.push(key, "other", weight)
    scheduler.push(0, "mine", 1)
    bound = sum(ws) + len(ws) + 1
    for _ in range(bound):
        for key, weight in others:  # the others refill as fast as they are served
            scheduler.push(key, "other", weight)
        if scheduler.pop() == "mine":
            return
    raise AssertionError(f"key 0 not served within {bound} pops")


@given(
    st.integers(1, 5), st.integers(1, 12), st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=80)
)
def test_the_bounds_hold_per_key_and_in_total(per_key: int, total: int, ops: list[tuple[int, bool]]) -> None:
    scheduler: FairScheduler[int] = FairScheduler(per_key, total)
    waiting: Counter[int] = Counter()
    for key, push in ops:
        if push:
            refused = scheduler.push(key, key)
            if waiting[key] >= per_key:
                assert refused == "key_queue_full"
            elif sum(waiting.values()) >= total:
                assert refused == "queue_full"
            else:
                assert refused is None
                waiting[key] += 1
        elif (item := scheduler.pop()) is not None:
            waiting[item] -= 1
        assert len(scheduler) == sum(waiting.values()) <= total
        assert all(scheduler.waiting(k) == n <= per_key for k, n in waiting.items())


def test_a_key_that_sends_less_than_its_share_goes_ahead_of_a_flood() -> None:
    scheduler: FairScheduler[str] = FairScheduler(1000, 1000)
    for _ in range(100):
        scheduler.push("flood", "A")
    scheduler.pop()
    scheduler.push("steady", "B")  # arrives behind 99 of the flood's
    assert [scheduler.pop(), scheduler.pop()] == ["B", "A"]


def test_a_removed_waiter_leaves_and_an_idle_key_is_forgotten() -> None:
    scheduler: FairScheduler[object] = FairScheduler(10, 10)
    mine = object()
    scheduler.push("k", mine)
    assert scheduler.remove("k", mine) and not scheduler.remove("k", mine)
    assert len(scheduler) == 0 and scheduler.pop() is None
    assert not scheduler._queues and not scheduler._last


def test_the_pool_capacity_is_the_workers_queue_times_the_routable_ones() -> None:
    assert pool_capacity(Pool("ns", "p", queue_capacity=4), 3) == 12
    assert pool_capacity(Pool("ns", "p", queue_capacity=4), 0) == 0
    assert pool_capacity(Pool("ns", "p", queue_capacity=4, host="h"), 2) is None  # shared: not queued
    assert pool_capacity(Pool("ns", "p"), 2) is None and pool_capacity(None, 2) is None


async def test_slots_go_to_waiters_by_weight_as_requests_end() -> None:
    capacity: dict[Key, int | None] = {POOL: 1}
    queues = FairQueues(10, 100, capacity.get)
    assert queues.try_start(POOL) and not queues.try_start(POOL)
    waiting = [
        (name, queues.enter(POOL, name, Share(weight=w))) for name, w in [("heavy", 2), ("light", 1)] * 4
    ]
    order = []
    for _ in range(6):
        queues.done(POOL)  # the running request ended: exactly one waiter gets its slot
        granted = [(name, s) for name, s in waiting if isinstance(s, Slot) and s.future.done()]
        assert len(granted) == 1 and queues.running(POOL) == 1
        order.append(granted[0][0])
        waiting.remove(granted[0])
    assert order.count("heavy") == 4 and order.count("light") == 2, order


async def test_bounds_refuse_and_a_leaving_waiter_gives_back_a_slot_it_got() -> None:
    capacity: dict[Key, int | None] = {POOL: 1}
    queues = FairQueues(1, 2, capacity.get)
    assert queues.try_start(POOL)
    first = queues.enter(POOL, "a", EQUAL_SHARE)
    assert queues.enter(POOL, "a", EQUAL_SHARE) == "key_queue_full"
    second = queues.enter(POOL, "b", EQUAL_SHARE)
    assert queues.enter(POOL, "c", EQUAL_SHARE) == "queue_full"
    assert isinstance(first, Slot) and isinstance(second, Slot)
    queues.done(POOL)
    assert first.future.result() is True
    queues.leave(POOL, first)  # its client left before using it: the slot goes on to the next
    assert second.future.result() is True and queues.running(POOL) == 1
    queues.done(POOL)
    assert queues.running(POOL) == 0 and queues.queued(POOL) == 0


async def test_a_pool_that_loses_its_workers_sends_its_waiters_back_to_be_routed() -> None:
    capacity: dict[Key, int | None] = {POOL: 1}
    queues = FairQueues(10, 10, capacity.get)
    assert queues.try_start(POOL)
    waiter = queues.enter(POOL, "a", EQUAL_SHARE)
    assert isinstance(waiter, Slot)
    capacity[POOL] = 0
    queues.changed(POOL)
    assert waiter.future.result() is False  # routed again: held until a worker comes


async def test_a_pool_without_capacity_is_never_queued() -> None:
    queues = FairQueues(1, 1, lambda _key: None)
    assert all(queues.try_start(POOL) for _ in range(100))


def test_the_key_secrets_weight_and_priority_and_the_strictest_of_several() -> None:
    assert parse_share(None, "") == EQUAL_SHARE
    assert parse_share("3", "10") == Share(3, 10)
    assert "weight" in str(parse_share("0", None)) and "priority" in str(parse_share(None, "-1"))

    def secret(name: str, **fields: str) -> dict[str, object]:
        data = {k: base64.b64encode(v.encode()).decode() for k, v in fields.items()}
        return {"metadata": {"namespace": "admin", "name": name}, "data": data}

    store = KeyStore("admin")
    key = "k" * 20
    store.set_secret(secret("admins", key=key, weight="4", priority="9"))
    assert store.share_of(token_digest(key.encode())) == Share(4, 9)
    store.set_secret(secret("more", key=key, weight="8"))  # cannot raise the admin's weight
    assert store.share_of(token_digest(key.encode())) == Share(4, 9)
    store.set_secret(secret("less", key=key, priority="1"))
    assert store.share_of(token_digest(key.encode())) == Share(4, 1)
    store.delete_secret(("admin", "less"))
    assert store.share_of(token_digest(key.encode())) == Share(4, 9)
    store.set_secret(secret("bad", key="b" * 20, weight="many"))  # refused whole
    assert store.grant(b"b" * 20) is None

    def tenants(name: str, **fields: str) -> dict[str, object]:
        found = secret(name, **fields)
        found["metadata"] = {"namespace": "team-a", "name": name}
        return found

    # A tenant's own key Secret (--tenant-keys) may not outrank the others: refused whole; the defaults pass.
    store.set_secret(tenants("mine", key="t" * 20, weight="5"))
    store.set_secret(tenants("mine-too", key="u" * 20, priority="1"))
    assert store.grant(b"t" * 20) is None and store.grant(b"u" * 20) is None
    store.set_secret(tenants("plain", key="v" * 20, weight="1", priority="0"))
    assert store.share_of(token_digest(b"v" * 20)) == Share(1, 0)


def test_a_request_joins_the_hold_behind_its_priority_and_ahead_of_lower_ones() -> None:
    assert queue_position([], 5) == 0
    assert queue_position([9, 5, 5, 0], 5) == 3
    assert queue_position([9, 5, 0], 10) == 0
    assert queue_position([9, 5, 0], 0) == 3


async def test_the_hold_at_zero_releases_higher_priorities_first() -> None:
    routable = {POOL: False}
    holds = Holds(10, lambda key: routable[key])
    low, high, mid = (holds.enter(POOL, p) for p in (0, 10, 5))
    assert low is not None and high is not None and mid is not None
    routable[POOL] = True
    holds.changed(POOL)
    assert high.future.done() and not mid.future.done() and not low.future.done()
    baton = high.future.result()
    assert baton is not None
    baton.passed()
    assert mid.future.done() and not low.future.done()
    await asyncio.gather()  # nothing left pending on the loop
