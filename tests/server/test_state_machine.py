"""The worker state machine: every (state, state) pair checked against the one transition table."""

from __future__ import annotations

import itertools

import pytest

from model_server.state_machine import (
    LIVE,
    SERVING,
    TRANSITIONS,
    IllegalTransition,
    LocalStore,
    State,
    StateMachine,
    can_transition,
)

S = State
# The edges the contract allows (docs/design.md, "Worker states"), written out independently of the
# implementation's table.
EXPECTED = {
    (S.PENDING, S.LOADING), (S.PENDING, S.FAILED), (S.PENDING, S.EVICTING),
    (S.LOADING, S.READY), (S.LOADING, S.FAILED), (S.LOADING, S.EVICTING),
    (S.READY, S.PROCESSING), (S.READY, S.IDLE), (S.READY, S.EVICTING), (S.READY, S.FAILED),
    (S.PROCESSING, S.READY), (S.PROCESSING, S.EVICTING), (S.PROCESSING, S.FAILED),
    (S.IDLE, S.PROCESSING), (S.IDLE, S.READY), (S.IDLE, S.EVICTING), (S.IDLE, S.FAILED),
    (S.EVICTING, S.DEAD), (S.EVICTING, S.FAILED),
}  # fmt: skip


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(State, State)))
def test_every_pair(src: State, dst: State) -> None:
    allowed = (src, dst) in EXPECTED
    assert can_transition(src, dst) is allowed
    store = LocalStore()
    store.write(src, 0.0, "")  # place the machine in ``src`` directly to test this one edge
    life = StateMachine(store=store)
    if src == dst:
        life.to(dst)  # staying put is a no-op, never an error
        assert life.state is src
    elif allowed:
        life.to(dst, "why")
        assert life.state is dst
        assert life.reason == "why"
    else:
        with pytest.raises(IllegalTransition):
            life.to(dst)
        assert life.state is src
        assert life.try_to(dst) is False
        assert life.state is src


def test_table_covers_every_state_and_terminal_states_are_final() -> None:
    assert set(TRANSITIONS) == set(State)
    assert TRANSITIONS[S.FAILED] == frozenset()
    assert TRANSITIONS[S.DEAD] == frozenset()


def test_probe_sets() -> None:
    assert {S.READY, S.PROCESSING, S.IDLE} == SERVING
    assert S.FAILED not in LIVE and S.DEAD not in LIVE
    assert S.LOADING in LIVE and S.LOADING not in SERVING
    assert S.EVICTING in LIVE and S.EVICTING not in SERVING


def test_happy_path_records_since_and_notifies() -> None:
    seen: list[tuple[State, State]] = []
    life = StateMachine(on_change=lambda a, b: seen.append((a, b)))
    before = life.since
    for dst in (S.LOADING, S.READY, S.PROCESSING, S.READY, S.IDLE, S.PROCESSING, S.READY, S.EVICTING, S.DEAD):
        life.to(dst)
    assert life.state is S.DEAD
    assert life.since >= before
    assert seen[0] == (S.PENDING, S.LOADING)
    assert seen[-1] == (S.EVICTING, S.DEAD)
    assert len(seen) == 9
