"""The demand Lease: its body (the demand time and the held count), when it is written, why many gateways
write about once per interval between them (simulated: each gateway sleeps until its next due time, as
``DemandRecorder``), and that a request held as a pool's refresh task ends is never lost."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_contract.api import API_VERSION, MODELPOOL_KIND
from modelpool_contract.demand import (
    ANNOTATION_HELD,
    ANNOTATION_REFUSED,
    Demand,
    demand_from_lease,
    demand_lease,
    demand_lease_name,
    micro_time,
    read_demand,
    renew,
)
from modelpool_contract.times import parse_time
from modelpool_gateway.demand import JITTER, Answer, DemandRecorder, LeaseClient, next_write_at
from modelpool_gateway.metrics import Metrics
from modelpool_gateway.state import Key, Pool

T0 = datetime(2026, 1, 1, tzinfo=UTC)
INTERVAL = timedelta(seconds=5)


def _lease(moment: datetime, holder: str = "gw-a") -> dict[str, Any]:
    return demand_lease(
        pool="p",
        pool_uid="u-1",
        moment=moment,
        holder=holder,
        duration_s=6,
        pool_api_version=API_VERSION,
        pool_kind=MODELPOOL_KIND,
    )


def test_the_lease_records_the_demand_with_microseconds() -> None:
    moment = T0 + timedelta(seconds=1.234567)
    lease = _lease(moment)
    assert lease["spec"]["renewTime"] == micro_time(moment) == "2026-01-01T00:00:01.234567Z"
    assert demand_from_lease(lease) == moment and parse_time("soon") is None
    assert lease["metadata"]["name"] == demand_lease_name("p") == "p-demand"


def test_a_renewal_keeps_the_owner_and_counts_a_new_holder() -> None:
    lease = _lease(T0)
    same = renew(lease, moment=T0 + INTERVAL, holder="gw-a", duration_s=6)
    other = renew(same, moment=T0 + 2 * INTERVAL, holder="gw-b", duration_s=6)
    assert same["metadata"] == other["metadata"] == lease["metadata"]
    assert same["spec"].get("leaseTransitions") is None and other["spec"]["leaseTransitions"] == 1
    assert demand_from_lease(other) == T0 + 2 * INTERVAL and lease["spec"]["renewTime"] == micro_time(T0)


def test_each_write_records_the_held_count_which_counts_only_while_the_lease_is_fresh() -> None:
    lease = demand_lease(
        pool="p",
        pool_uid="u-1",
        moment=T0,
        holder="gw-a",
        duration_s=10,
        pool_api_version=API_VERSION,
        pool_kind=MODELPOOL_KIND,
        held=7,
    )
    assert lease["metadata"]["annotations"] == {ANNOTATION_HELD: "7", ANNOTATION_REFUSED: "0"}
    assert read_demand(lease) == Demand(T0, 7, 10, 0)
    renewed = renew(lease, moment=T0 + INTERVAL, holder="gw-b", duration_s=10, held=2)
    demand = read_demand(renewed)
    assert demand == Demand(T0 + INTERVAL, 2, 10, 0)  # the latest writer's count (a lower bound)
    assert demand.held_at(T0 + INTERVAL + timedelta(seconds=10)) == 2
    assert demand.held_at(T0 + INTERVAL + timedelta(seconds=10.001)) is None  # stale: the holds ended
    # An older gateway's Lease (no annotation) or an unreadable count: unknown, never an error.
    for value in (None, "many", "-3", True):
        other = dict(renewed, metadata={**renewed["metadata"], "annotations": {ANNOTATION_HELD: value}})
        assert read_demand(other) == Demand(T0 + INTERVAL, None, 10)
        assert Demand(T0, None, 10).held_at(T0) is None


def test_a_long_pool_name_still_gives_a_valid_lease_name() -> None:
    name = demand_lease_name("p" * 253)
    assert len(name) <= 253 and name.endswith("-demand") and name != demand_lease_name("p" * 252)


def test_due_at_once_without_any_write_then_an_interval_after_the_last() -> None:
    assert next_write_at(None, None, INTERVAL) is None
    assert next_write_at(T0, None, INTERVAL) == T0 + INTERVAL
    assert next_write_at(T0, T0, INTERVAL, jitter=0.1) == T0 + INTERVAL * 1.1


def test_another_replicas_fresher_write_postpones_ours() -> None:
    theirs = T0 + timedelta(seconds=3)
    assert next_write_at(T0, theirs, INTERVAL) == theirs + INTERVAL
    # A timestamp from a clock ahead of ours counts as fresh, not as stale.
    ahead = T0 + timedelta(seconds=30)
    assert next_write_at(None, ahead, INTERVAL) == ahead + INTERVAL


def _simulate(gateways: int, seed: int, delay: timedelta, seconds: float = 60) -> list[tuple[datetime, int]]:
    """Every gateway holds requests from a moment in the first 100 ms for ``seconds``; each round it reads
    the Lease, which shows the writes up to ``delay`` before it decides (the read's round trip), and writes
    when due.  A write based on a read that another write has overtaken fails (409: the resourceVersion is
    stale) and that gateway reads again at once; each draws its jitter again after each of its writes, as
    ``DemandRecorder`` does.  The writes that succeed, in order."""
    rng = random.Random(seed)
    jitters = [rng.uniform(0, JITTER) for _ in range(gateways)]
    checks = [(T0 + timedelta(seconds=rng.uniform(0, 0.1)), g) for g in range(gateways)]
    heapq.heapify(checks)
    own: dict[int, datetime] = {}
    writes: list[tuple[datetime, int]] = []
    while checks:
        now, g = heapq.heappop(checks)
        if now > T0 + timedelta(seconds=seconds):
            continue
        read_at = now - delay
        visible = [w for w, _ in writes if w <= read_at]
        due = next_write_at(own.get(g), max(visible) if visible else None, INTERVAL, jitters[g])
        if due is not None and now < due:
            heapq.heappush(checks, (min(due, now + INTERVAL), g))
        elif any(read_at < w for w, _ in writes):  # 409: read again (a round trip later)
            heapq.heappush(checks, (now + max(delay, timedelta(milliseconds=1)), g))
        else:
            own[g] = now
            writes.append((now, g))
            jitters[g] = rng.uniform(0, JITTER)
            heapq.heappush(checks, (now + INTERVAL, g))
    return writes


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 20), st.integers(0, 2**32), st.sampled_from([0, 1, 20, 50, 200]))
def test_gateways_write_once_per_interval_between_them_whatever_their_reads_delay(
    gateways: int, seed: int, delay_ms: int
) -> None:
    """Reading the Lease before writing and the 409 on a stale resourceVersion: never two writes within an
    interval, however many gateways and however slow their reads."""
    writes = _simulate(gateways, seed, timedelta(milliseconds=delay_ms))
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(writes)]
    assert all(gap >= INTERVAL for gap in gaps), gaps
    assert 60 / 6.5 <= len(writes) <= 60 / 5 + 1


def test_the_replica_with_the_smallest_jitter_refreshes_the_demand() -> None:
    """Three replicas whose reads take 20 ms, over an hour: a write about every 5-6 s, shared out between
    them as their jitters fall (each draws again after its writes), never two in one interval."""
    writes = _simulate(3, seed=7, delay=timedelta(milliseconds=20), seconds=3600)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(writes)]
    assert all(gap >= INTERVAL for gap in gaps)
    assert len(writes) >= 3600 / 6.5  # a write every 5-6 s
    assert {g for _, g in writes} == {0, 1, 2}


# ---- the recorder's task per pool --------------------------------------------------------------------


class _Leases(LeaseClient):
    """The API server's Lease store for one namespace, in memory (the integration tests use the real one)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.leases: dict[str, dict[str, Any]] = {}

    async def read(self, namespace: str, name: str) -> Answer:
        lease = self.leases.get(name)
        return Answer(200, lease) if lease is not None else Answer(404, None)

    async def create(self, namespace: str, body: dict[str, Any]) -> Answer:
        self.leases[body["metadata"]["name"]] = body
        return Answer(201, body)

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> Answer:
        self.leases[name] = body
        return Answer(200, body)


KEY: Key = ("ns", "p")


def _recorder(leases: LeaseClient, held: dict[Key, int], rounds: list[Key]) -> DemandRecorder:
    def pool(key: Key) -> Pool | None:
        rounds.append(key)
        return Pool(*KEY, uid="u-1") if key == KEY else None

    return DemandRecorder(
        leases, pools=pool, held=lambda key: held.get(key, 0), metrics=Metrics(), interval_s=5, holder="gw"
    )


async def test_a_write_records_how_many_requests_this_replica_holds() -> None:
    leases, held, rounds = _Leases(), {KEY: 3}, list[Key]()
    recorder = _recorder(leases, held, rounds)
    assert await recorder.round(KEY) == 5.0
    assert read_demand(leases.leases["p-demand"]).held == 3  # type: ignore[union-attr]
    held[KEY] = 9
    recorder.forget(KEY)  # due again at once
    leases.leases["p-demand"]["spec"]["renewTime"] = micro_time(T0)
    assert await recorder.round(KEY) == 5.0
    assert read_demand(leases.leases["p-demand"]).held == 9  # type: ignore[union-attr]


def test_each_write_records_the_hold_full_refusals_which_count_only_while_fresh() -> None:
    lease = demand_lease(
        pool="p",
        pool_uid="u-1",
        moment=T0,
        holder="gw-a",
        duration_s=10,
        pool_api_version=API_VERSION,
        pool_kind=MODELPOOL_KIND,
        held=4,
        refused=12,
    )
    assert lease["metadata"]["annotations"] == {ANNOTATION_HELD: "4", ANNOTATION_REFUSED: "12"}
    assert read_demand(lease) == Demand(T0, 4, 10, 12)
    renewed = read_demand(renew(lease, moment=T0 + INTERVAL, holder="gw-b", duration_s=10, refused=3))
    assert renewed == Demand(T0 + INTERVAL, 0, 10, 3)  # the latest writer's window, not a running total
    assert renewed.refused_at(T0 + INTERVAL + timedelta(seconds=10)) == 3
    assert renewed.refused_at(T0 + INTERVAL + timedelta(seconds=10.001)) is None
    assert Demand(T0, 4, 10).refused_at(T0) is None  # an older gateway: unknown


async def test_a_write_reports_the_refusals_since_the_last_one_once_even_after_the_hold_emptied() -> None:
    leases, held, rounds = _Leases(), {KEY: 1}, list[Key]()
    recorder = _recorder(leases, held, rounds)
    for _ in range(3):
        recorder.refused(KEY)  # the hold was full
    assert await recorder.round(KEY) == 5.0
    assert read_demand(leases.leases["p-demand"]).refused == 3  # type: ignore[union-attr]
    assert recorder.refused_pending(KEY) == 0
    held[KEY] = 0  # the hold empties (a worker serves) before a later refusal is reported
    leases.leases["p-demand"]["spec"]["renewTime"] = micro_time(T0)
    recorder.forget(KEY)  # due again at once
    recorder.refused(KEY)
    assert recorder.recording(KEY)  # a refusal alone keeps the demand task going until it is written
    await _until(lambda: recorder.refused_pending(KEY) == 0)
    lease = read_demand(leases.leases["p-demand"])
    assert lease is not None and (lease.held, lease.refused) == (0, 1)
    await recorder.close()


async def _until(done: Any) -> None:
    """Let the event loop run, a step at a time, until ``done()`` (bounded)."""
    for _ in range(1000):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("not done after 1000 steps of the event loop")


async def test_a_request_held_as_the_refresh_task_ends_starts_a_new_one() -> None:
    """The gap between the task's last check (nothing held) and its removal: a request held there must
    start a new task.  Driven step by step: ``sleep(0)`` lets exactly the ready callbacks run once."""
    held: dict[Key, int] = {}
    rounds: list[Key] = []
    recorder = _recorder(_Leases(), held, rounds)
    recorder.note(KEY)  # a request held, and released before the task first runs
    await asyncio.sleep(0)  # the task runs: nothing held, its loop ends
    held[KEY] = 1  # a request held in the very next step
    recorder.note(KEY)
    assert recorder.recording(KEY)
    for _ in range(3):
        await asyncio.sleep(0)
    assert rounds == [KEY]  # the new task refreshed the demand (it read the pool, then the Lease)
    held[KEY] = 0
    await recorder.close()
