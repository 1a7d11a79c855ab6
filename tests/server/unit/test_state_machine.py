"""The worker state machine: every (state, state) pair checked against the one transition table."""

from __future__ import annotations

import itertools

import pytest

from model_server.state_machine import (
    LIVE,
    SERVING,
    SLEEPABLE,
    TRANSITIONS,
    IllegalTransition,
    LocalStore,
    State,
    StateMachine,
    can_transition,
)
from modelpool_contract.states import SLEEPABLE_STATES

# The edges the contract allows (docs/design.md, "Worker states"), written out independently of the
# implementation's table: each state and the states it may move to.
ALLOWED_MOVES = {
    State.PENDING: (State.LOADING, State.FAILED, State.EVICTING),
    State.LOADING: (State.READY, State.FAILED, State.EVICTING),
    State.READY: (State.PROCESSING, State.IDLE, State.SLEEPING, State.EVICTING, State.FAILED),
    State.PROCESSING: (State.READY, State.EVICTING, State.FAILED),
    State.IDLE: (State.PROCESSING, State.READY, State.SLEEPING, State.EVICTING, State.FAILED),
    State.SLEEPING: (State.WAKING, State.EVICTING, State.FAILED),
    State.WAKING: (State.READY, State.EVICTING, State.FAILED),
    State.EVICTING: (State.DEAD, State.FAILED),
}
EXPECTED = {(src, dst) for src, moves in ALLOWED_MOVES.items() for dst in moves}


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
    assert TRANSITIONS[State.FAILED] == frozenset()
    assert TRANSITIONS[State.DEAD] == frozenset()


def test_probe_sets() -> None:
    assert {State.READY, State.PROCESSING, State.IDLE} == SERVING
    assert State.FAILED not in LIVE and State.DEAD not in LIVE
    assert State.LOADING in LIVE and State.LOADING not in SERVING
    assert State.EVICTING in LIVE and State.EVICTING not in SERVING
    assert {State.SLEEPING, State.WAKING} <= LIVE and not {State.SLEEPING, State.WAKING} & SERVING
    assert {state.value for state in SLEEPABLE} == SLEEPABLE_STATES
    assert all(can_transition(state, State.SLEEPING) for state in SLEEPABLE)
    assert not any(can_transition(state, State.SLEEPING) for state in set(State) - SLEEPABLE)


def test_happy_path_records_since_and_notifies() -> None:
    seen: list[tuple[State, State]] = []
    life = StateMachine(on_change=lambda a, b: seen.append((a, b)))
    before = life.since
    for dst in (
        State.LOADING,
        State.READY,
        State.PROCESSING,
        State.READY,
        State.IDLE,
        State.PROCESSING,
        State.READY,
        State.EVICTING,
        State.DEAD,
    ):
        life.to(dst)
    assert life.state is State.DEAD
    assert life.since >= before
    assert seen[0] == (State.PENDING, State.LOADING)
    assert seen[-1] == (State.EVICTING, State.DEAD)
    assert len(seen) == 9
