"""The demand Lease: its body, when it is written, and why many gateways write about once per
interval between them (simulated: each gateway sleeps until its next due time, as ``DemandRecorder``)."""

from __future__ import annotations

import heapq
import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_contract.api import API_VERSION, MODELPOOL_KIND
from modelpool_contract.demand import (
    demand_from_lease,
    demand_lease,
    demand_lease_name,
    micro_time,
    parse_micro_time,
    renew,
)
from modelpool_gateway.demand import JITTER, next_write_at

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
    assert demand_from_lease(lease) == moment and parse_micro_time("soon") is None
    assert lease["metadata"]["name"] == demand_lease_name("p") == "p-demand"


def test_a_renewal_keeps_the_owner_and_counts_a_new_holder() -> None:
    lease = _lease(T0)
    same = renew(lease, moment=T0 + INTERVAL, holder="gw-a", duration_s=6)
    other = renew(same, moment=T0 + 2 * INTERVAL, holder="gw-b", duration_s=6)
    assert same["metadata"] == other["metadata"] == lease["metadata"]
    assert same["spec"].get("leaseTransitions") is None and other["spec"]["leaseTransitions"] == 1
    assert demand_from_lease(other) == T0 + 2 * INTERVAL and lease["spec"]["renewTime"] == micro_time(T0)


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
