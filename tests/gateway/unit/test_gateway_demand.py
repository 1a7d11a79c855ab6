"""The demand Lease: its body (the demand time and each replica's share), when a replica writes, that the
reader sums every live replica's latest share whatever the order of the writes (properties over simulated
replicas) and that stale shares drop out and are pruned, an older gateway's Lease, two recorders on one
Lease (a 409 re-applies the loser's share), and that a request held as a pool's refresh task ends is never
lost."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_contract.api import API_VERSION, MODELPOOL_KIND
from modelpool_contract.demand import (
    ANNOTATION_HELD,
    ANNOTATION_REFUSED,
    SHARE_PREFIX,
    Demand,
    Share,
    demand_from_lease,
    demand_lease,
    demand_lease_name,
    live_shares,
    micro_time,
    prune_shares,
    read_demand,
    renew,
    replica_id,
    share_annotation,
)
from modelpool_contract.times import parse_time
from modelpool_gateway.demand import Answer, DemandRecorder, LeaseClient, next_write_at
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
    keep = ("name", "labels", "ownerReferences")
    assert [same["metadata"][k] for k in keep] == [other["metadata"][k] for k in keep]
    assert [lease["metadata"][k] for k in keep] == [other["metadata"][k] for k in keep]
    assert same["spec"].get("leaseTransitions") is None and other["spec"]["leaseTransitions"] == 1
    assert demand_from_lease(other) == T0 + 2 * INTERVAL and lease["spec"]["renewTime"] == micro_time(T0)


def test_each_write_records_the_writers_share_which_counts_only_while_live() -> None:
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
    entry, a = share_annotation("gw-a"), replica_id("gw-a")
    assert entry == SHARE_PREFIX + a and len(entry.split("/")[1]) <= 63  # an annotation name's limit
    assert lease["metadata"]["annotations"] == {entry: "held=7,refused=0,at=2026-01-01T00:00:00.000000Z"}
    assert read_demand(lease) == Demand(T0, 10, (Share(a, T0, 7, 0),))
    renewed = renew(lease, moment=T0 + INTERVAL, holder="gw-b", duration_s=10, held=2)
    demand = read_demand(renewed)
    assert demand is not None and demand.at == T0 + INTERVAL
    assert demand.held_at(T0 + INTERVAL) == 9  # both replicas' shares, not the last writer's
    assert demand.held_at(T0 + timedelta(seconds=10)) == 9
    assert demand.held_at(T0 + timedelta(seconds=10.001)) == 2  # gw-a's share stopped counting
    assert demand.held_at(T0 + INTERVAL + timedelta(seconds=10.001)) is None  # stale: the holds ended
    # An unreadable count is unknown, never an error; an entry without a readable time counts for nothing.
    for value, share in (
        ("held=many,at=2026-01-01T00:00:05Z", Share(a, T0 + INTERVAL)),
        ("at=2026-01-01T00:00:05Z,refused=1,held=-3,new=x", Share(a, T0 + INTERVAL, None, 1)),
    ):
        other = dict(renewed, metadata={**renewed["metadata"], "annotations": {entry: value}})
        assert read_demand(other) == Demand(T0 + INTERVAL, 10, (share,))
    for bad in (None, 3, "held=3", "held=3,at=soon", ""):
        other = dict(renewed, metadata={**renewed["metadata"], "annotations": {entry: bad}})
        assert read_demand(other) == Demand(T0 + INTERVAL, 10)
    assert Demand(T0, 10).held_at(T0) is None
    assert Demand(T0, None, (Share(a, T0, 3, 0),)).held_at(T0) is None  # no duration: nothing counts


def test_a_long_pool_name_still_gives_a_valid_lease_name() -> None:
    name = demand_lease_name("p" * 253)
    assert len(name) <= 253 and name.endswith("-demand") and name != demand_lease_name("p" * 252)


def test_due_at_once_without_any_write_then_an_interval_after_this_replicas_last() -> None:
    assert next_write_at(None, INTERVAL) is None
    assert next_write_at(T0, INTERVAL) == T0 + INTERVAL


Write = tuple[int, float, int, int]  # replica, seconds after T0 (whole milliseconds), held, refused


def _apply(writes: list[Write], duration_s: int) -> dict[str, Any]:
    """The Lease after ``writes`` in time order, each a replica's renewal of the Lease as it stood (the API
    server serializes them: a writer that lost a race reads again and re-applies its share)."""
    lease: dict[str, Any] | None = None
    for replica, offset, held, refused in sorted(writes, key=lambda w: w[1]):
        moment, holder = T0 + timedelta(seconds=offset), f"gw-{replica}"
        if lease is None:
            lease = demand_lease(
                pool="p", pool_uid="u-1", moment=moment, holder=holder, duration_s=duration_s,
                pool_api_version=API_VERSION, pool_kind=MODELPOOL_KIND, held=held, refused=refused,
            )  # fmt: skip
        else:
            lease = renew(
                lease, moment=moment, holder=holder, duration_s=duration_s, held=held, refused=refused
            )
    assert lease is not None
    return lease


def _expected(writes: list[Write], now: datetime, duration_s: int, field: Literal[2, 3]) -> int | None:
    """The sum of each replica's latest count (``field``: held, or refused) whose write is within
    ``duration_s`` of ``now``."""
    latest: dict[int, Write] = {}
    for write in sorted(writes, key=lambda w: w[1]):
        latest[write[0]] = write
    live = [w[field] for w in latest.values() if abs((now - T0).total_seconds() - w[1]) <= duration_s]
    return sum(live) if live else None


_writes = st.lists(
    st.tuples(
        st.integers(0, 4),
        st.integers(0, 60_000).map(lambda ms: ms / 1000),
        st.integers(0, 50),
        st.integers(0, 9),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(_writes, st.integers(1, 20), st.integers(0, 30_000).map(lambda ms: ms / 1000))
def test_the_lease_sums_every_live_replicas_latest_share_whatever_the_order_of_writes(
    writes: list[Write], duration_s: int, later: float
) -> None:
    """Replicas renewing their own shares in any interleaving: the reader sees the sum of each replica's
    latest counts still live (not the last writer's), and the writers pruned every share stale at their
    write, so the Lease holds no more entries than replicas."""
    lease = _apply(writes, duration_s)
    demand = read_demand(lease)
    assert demand is not None
    last = max(w[1] for w in writes)
    for now in (T0 + timedelta(seconds=last), T0 + timedelta(seconds=last + later)):
        assert demand.held_at(now) == _expected(writes, now, duration_s, 2)
        assert demand.refused_at(now) == _expected(writes, now, duration_s, 3)
    entries = [a for a in lease["metadata"]["annotations"] if a.startswith(SHARE_PREFIX)]
    at_last = T0 + timedelta(seconds=last)
    assert len(entries) == len(demand.shares) == len(live_shares(demand.shares, at_last, duration_s))
    assert len(entries) <= len({w[0] for w in writes})


@given(_writes, st.integers(1, 20))
def test_pruning_keeps_every_live_share_and_every_other_annotation(
    writes: list[Write], duration_s: int
) -> None:
    lease = _apply(writes, duration_s)
    annotations = {**lease["metadata"]["annotations"], "example.com/note": "kept", SHARE_PREFIX + "x": "bad"}
    at = T0 + timedelta(seconds=max(w[1] for w in writes))
    kept = prune_shares(annotations, None, at, duration_s)
    assert kept.pop("example.com/note") == "kept" and SHARE_PREFIX + "x" not in kept
    assert kept == lease["metadata"]["annotations"]  # the last write pruned already: nothing more to drop
    assert prune_shares(annotations, None, at + timedelta(seconds=duration_s + 1), duration_s) == {
        "example.com/note": "kept"
    }


def test_an_older_gateways_lease_reads_as_its_writers_share_and_becomes_that_replicas_entry() -> None:
    """One release of compatibility: the single count pair an older gateway wrote is its writer's share at
    renewTime; a newer replica's renewal keeps it (with its own time) as that replica's entry."""
    old = _lease(T0, holder="gw-old")
    old["metadata"]["annotations"] = {ANNOTATION_HELD: "5", ANNOTATION_REFUSED: "2"}
    assert read_demand(old) == Demand(T0, 6, (Share(replica_id("gw-old"), T0, 5, 2),))
    mixed = renew(old, moment=T0 + timedelta(seconds=2), holder="gw-new", duration_s=6, held=3)
    annotations = mixed["metadata"]["annotations"]
    assert ANNOTATION_HELD not in annotations and ANNOTATION_REFUSED not in annotations
    assert annotations[share_annotation("gw-old")] == "held=5,refused=2,at=2026-01-01T00:00:00.000000Z"
    demand = read_demand(mixed)
    assert demand is not None and demand.held_at(T0 + timedelta(seconds=2)) == 8
    assert demand.held_at(T0 + timedelta(seconds=6.5)) == 3  # the older replica's share expired on its own
    # The older gateway renews again (it keeps every annotation and writes its pair): counted once, newest.
    again = copy.deepcopy(mixed)
    again["metadata"]["annotations"].update({ANNOTATION_HELD: "1", ANNOTATION_REFUSED: "0"})
    again["spec"].update(holderIdentity="gw-old", renewTime=micro_time(T0 + timedelta(seconds=4)))
    demand = read_demand(again)
    assert demand is not None and demand.held_at(T0 + timedelta(seconds=4)) == 4
    assert len(demand.shares) == 3 and demand.held == 4  # its entry and its newer pair: the newer counts
    # A stale pair is dropped, not carried over.
    stale = renew(old, moment=T0 + timedelta(seconds=7), holder="gw-new", duration_s=6, held=3)
    assert set(stale["metadata"]["annotations"]) == {share_annotation("gw-new")}


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
        if body["metadata"]["name"] in self.leases:
            return Answer(409, {"message": "already exists"})
        return self._store(body["metadata"]["name"], body, 201)

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> Answer:
        # Optimistic concurrency as the API server's: an update from a read another write overtook fails.
        if body["metadata"].get("resourceVersion") != self.leases[name]["metadata"].get("resourceVersion"):
            return Answer(409, {"message": "the object has been modified"})
        return self._store(name, body, 200)

    def _store(self, name: str, body: dict[str, Any], status: int) -> Answer:
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(int(stored["metadata"].get("resourceVersion") or 0) + 1)
        self.leases[name] = stored
        return Answer(status, copy.deepcopy(stored))


KEY: Key = ("ns", "p")


def _recorder(
    leases: LeaseClient,
    held: dict[Key, int],
    rounds: list[Key],
    holder: str = "gw",
    clock: list[datetime] | None = None,
) -> DemandRecorder:
    def pool(key: Key) -> Pool | None:
        rounds.append(key)
        return Pool(*KEY, uid="u-1") if key == KEY else None

    return DemandRecorder(
        leases,
        pools=pool,
        held=lambda key: held.get(key, 0),
        metrics=Metrics(),
        interval_s=5,
        holder=holder,
        **({"clock": lambda: clock[0]} if clock else {}),  # type: ignore[arg-type]
    )


async def test_a_write_records_how_many_requests_this_replica_holds() -> None:
    leases, held, rounds = _Leases(), {KEY: 3}, list[Key]()
    recorder = _recorder(leases, held, rounds)
    assert await recorder.round(KEY) == 5.0
    assert read_demand(leases.leases["p-demand"]).held == 3  # type: ignore[union-attr]
    held[KEY] = 9
    recorder.forget(KEY)  # due again at once
    assert await recorder.round(KEY) == 5.0
    assert read_demand(leases.leases["p-demand"]).held == 9  # type: ignore[union-attr]  # replaced, not added


async def test_two_replicas_each_write_their_share_and_the_lease_shows_the_sum() -> None:
    """Both write every interval (another's write postpones nothing); a 409 makes the loser read again at
    once and add its share to the winner's write; the share of a replica whose holds ended drops out within
    the lease duration and the next writer prunes it."""
    leases, rounds, clock = _Leases(), list[Key](), [T0]
    held_a, held_b = {KEY: 3}, {KEY: 4}
    a = _recorder(leases, held_a, rounds, holder="gw-a", clock=clock)
    b = _recorder(leases, held_b, rounds, holder="gw-b", clock=clock)

    def lease() -> Demand:
        demand = read_demand(leases.leases["p-demand"])
        assert demand is not None
        return demand

    stale = await leases.read("ns", "p-demand")  # nothing yet: both decided to create
    assert stale.status == 404
    assert await a.round(KEY) == 5.0
    assert await b.attempt(Pool(*KEY, uid="u-1"), None, clock[0]) == "conflict"  # the create raced
    assert await b.round(KEY) == 5.0  # read again, b's share added to a's Lease
    assert lease().held_at(clock[0]) == 7
    read = copy.deepcopy(leases.leases["p-demand"])
    clock[0] = T0 + INTERVAL
    assert await a.round(KEY) == 5.0
    assert await b.attempt(Pool(*KEY, uid="u-1"), read, clock[0]) == "conflict"  # updated from a stale read
    assert await b.round(KEY) == 5.0  # read again at once: its share re-applied on a's write
    assert lease().held_at(clock[0]) == 7 and len(lease().shares) == 2

    held_b[KEY] = 0  # b's holds end: it writes no more
    clock[0] = T0 + 2 * INTERVAL
    assert await a.round(KEY) == 5.0
    assert lease().held_at(clock[0]) == 7  # b's share is still live (written at T0 + 5 s, duration 10 s)
    clock[0] = T0 + 3 * INTERVAL + timedelta(seconds=0.5)
    assert lease().held_at(clock[0]) == 3  # ... and drops out for the reader within the lease duration
    assert await a.round(KEY) == 5.0
    assert [s.replica for s in lease().shares] == [replica_id("gw-a")]  # pruned by a's write


def test_each_write_records_the_hold_full_refusals_which_count_only_while_live() -> None:
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
    a, b = replica_id("gw-a"), replica_id("gw-b")
    assert read_demand(lease) == Demand(T0, 10, (Share(a, T0, 4, 12),))
    renewed = read_demand(renew(lease, moment=T0 + INTERVAL, holder="gw-b", duration_s=10, refused=3))
    assert renewed is not None and set(renewed.shares) == {Share(a, T0, 4, 12), Share(b, T0 + INTERVAL, 0, 3)}
    assert renewed.refused_at(T0 + INTERVAL) == 15  # each replica's window since its own previous write
    assert renewed.refused_at(T0 + INTERVAL + timedelta(seconds=10)) == 3
    assert renewed.refused_at(T0 + INTERVAL + timedelta(seconds=10.001)) is None
    assert Demand(T0, 10, (Share(a, T0, 4),)).refused_at(T0) is None  # not recorded: unknown


async def test_a_write_reports_the_refusals_since_the_last_one_once_even_after_the_hold_emptied() -> None:
    leases, held, rounds = _Leases(), {KEY: 1}, list[Key]()
    recorder = _recorder(leases, held, rounds)
    for _ in range(3):
        recorder.refused(KEY)  # the hold was full
    assert await recorder.round(KEY) == 5.0
    assert read_demand(leases.leases["p-demand"]).refused == 3  # type: ignore[union-attr]
    assert recorder.refused_pending(KEY) == 0
    held[KEY] = 0  # the hold empties (a worker serves) before a later refusal is reported
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
