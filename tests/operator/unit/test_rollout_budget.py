"""A roll-over under a full budget never drops a pool below the serving count it had (issue 31, item 3).

With room for a surge the new workers come first (``test_planner.py``). Without it (the ModelBudget holds
exactly the pool's workers) the outdated ones give way one by one within ``spec.disruption.maxUnavailable``:
the serving count stays at or above the count when the roll-over began minus ``maxUnavailable``, pass
after pass, and with ``maxUnavailable`` 0 the roll-over waits, saying why. Pure: ``planner.plan`` over a
simulated world, the passes applied to it as the operator and the kubelet would.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_contract.api import ModelPoolSpec, ModelPoolStatus
from modelpool_contract.states import SERVING_STATES, STARTING_STATES
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import EVICT_ROLLOVER, Plan, plan
from modelpool_operator.planner.status import ROLL_OVER_WAITING
from tests.operator.unit.op_planner import cond, ledger_for, make_spec, view, w
from tests.operator.unit.op_pods import GI, at

MEMORY = 2 * GI  # each worker's charge (make_spec's resources.memory)


def _spec(replicas: int, max_unavailable: int | None) -> ModelPoolSpec:
    extra = {} if max_unavailable is None else {"disruption": {"maxUnavailable": max_unavailable}}
    # No idle eviction and no autoscaling: the workers of this world never get a request.
    return make_spec(
        replicas=replicas,
        minReplicas=0,
        maxReplicas=max(replicas, 1),
        idleTimeoutSeconds=0,
        autoscaling={"enabled": False},
        **extra,
    )


def _old(count: int) -> list[ObservedWorker]:
    return [w(f"p-old-{i}", template_hash="h0", last_request=i) for i in range(count)]


def _serving(workers: list[ObservedWorker]) -> int:
    return sum(1 for x in workers if x.state in SERVING_STATES)


@dataclass
class World:
    """The pool's workers as the API server would show them, moved by each plan and by the clock."""

    spec: ModelPoolSpec
    workers: list[ObservedWorker]
    total: int
    status: ModelPoolStatus = field(default_factory=ModelPoolStatus)
    now: float = 1000.0
    lowest: int = 10**6  # the fewest serving workers after any pass

    def step(self, advance: list[bool]) -> Plan:
        out = plan(
            view(self.spec, self.status), self.workers, ledger_for(self.total, self.workers), now=at(self.now)
        )
        gone = {d.name for d in out.delete}
        evicted = {e.name: e.reason for e in out.evict}
        moved = []
        for x in self.workers:
            if x.name in gone:
                continue
            reason = evicted.get(x.name)
            since = at(self.now)
            moved.append(
                x
                if reason is None
                else replace(x, state="Evicting", evicting_reason=reason, evicting_since=since)
            )
        moved += [w(c.name, "Pending", since=self.now) for c in out.create]
        self.lowest = min(self.lowest, _serving(moved))
        # The kubelet and the server: a starting worker moves on (Pending -> Loading -> Ready) when drawn so.
        ahead = iter(advance)
        for i, x in enumerate(moved):
            if x.state in STARTING_STATES and next(ahead, True):
                moved[i] = replace(x, state="Loading" if x.state == "Pending" else "Ready")
        self.workers, self.status = moved, out.status
        self.now += 10  # past the drain grace: an evicted worker is deleted at the next pass
        return out


def test_without_room_for_a_surge_one_outdated_worker_goes_at_a_time() -> None:
    world = World(_spec(3, None), _old(3), total=3 * MEMORY)
    first = world.step([])
    assert [(e.name, e.reason) for e in first.evict] == [("p-old-0", EVICT_ROLLOVER)] and not first.create
    assert first.status.rollout is not None and first.status.rollout.ready_before == 3
    # Draining: its memory is not free yet and nothing else goes.
    second = world.step([])
    assert not second.evict and [d.name for d in second.delete] == ["p-old-0"]
    # Gone: its replacement is admitted into the memory it freed; no other old worker goes while it loads.
    third = world.step([False])
    assert len(third.create) == 1 and not third.evict
    fourth = world.step([False])
    assert not fourth.evict and cond(fourth, "Progressing") == ("True", ROLL_OVER_WAITING)
    progressing = next(c for c in fourth.status.conditions if c.type == "Progressing")
    assert (
        "2 serving, at least 2 must (3 when it began, spec.disruption.maxUnavailable 1)"
        in progressing.message
    )
    assert fourth.status.rollout is not None and fourth.status.rollout.ready_before == 3
    # Once it serves, the next old worker goes.
    world.workers = [replace(x, state="Ready") if x.state in STARTING_STATES else x for x in world.workers]
    fifth = world.step([])
    assert [e.name for e in fifth.evict] == ["p-old-1"]
    assert world.lowest >= 2


def test_max_unavailable_zero_waits_for_room_and_says_why() -> None:
    world = World(_spec(2, 0), _old(2), total=2 * MEMORY)
    out = world.step([])
    assert not out.evict and not out.create
    assert cond(out, "Progressing") == ("True", ROLL_OVER_WAITING)
    progressing = next(c for c in out.status.conditions if c.type == "Progressing")
    assert "spec.disruption.maxUnavailable 0 lets none of them go first" in progressing.message
    # Room for a surge (the budget grew): the new worker comes first, the roll-over goes on.
    world.total = 3 * MEMORY
    grown = world.step([])
    assert len(grown.create) == 1 and not grown.evict
    assert cond(grown, "Progressing") == ("True", "RollingOver")


def test_max_unavailable_two_retires_two_at_once_and_the_rollout_status_clears_at_the_end() -> None:
    world = World(_spec(4, 2), _old(4), total=4 * MEMORY)
    first = world.step([])
    assert [e.name for e in first.evict] == ["p-old-0", "p-old-1"]
    for _ in range(20):
        world.step([])
    assert (
        all(x.template_hash == "h1" and x.state == "Ready" for x in world.workers) and len(world.workers) == 4
    )
    assert world.status.rollout is None and world.lowest >= 2


@settings(max_examples=150, deadline=None)
@given(
    replicas=st.integers(1, 5),
    max_unavailable=st.integers(0, 3),
    spare=st.integers(0, 1),
    advance=st.lists(st.booleans(), max_size=60),
)
def test_the_serving_count_never_drops_below_what_it_had_less_max_unavailable(
    replicas: int, max_unavailable: int, spare: int, advance: list[bool]
) -> None:
    """Any pool size, disruption budget and order in which new workers come up: the serving count never
    falls below ``replicas - maxUnavailable`` (all serving when the roll-over began); with room for a
    surge or ``maxUnavailable`` >= 1 the roll-over finishes; with neither it waits, retiring nobody."""
    world = World(_spec(replicas, max_unavailable), _old(replicas), total=(replicas + spare) * MEMORY)
    draws = iter(advance)
    for _ in range(12 * replicas + 10):
        world.step([next(draws, True) for _ in range(replicas + 2)])
    assert world.lowest >= replicas - max_unavailable
    done = all(x.template_hash == "h1" for x in world.workers)
    if spare or max_unavailable:
        assert done and _serving(world.workers) == replicas, world.workers
    else:
        assert not done and world.lowest == replicas
