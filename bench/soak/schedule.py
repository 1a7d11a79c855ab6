"""The soak's fault schedule, a pure function: (seed, length, spacing, required faults) -> [(time, fault)].

The same seed gives the same faults at the same offsets (the targets are drawn from the seed too, as
indexes the fault actions take modulo what exists when the fault fires), so a run that broke an invariant
can be run again.  Some faults must appear a number of times (``required``: the control-plane restart at
least twice in the default run); they are placed first, spread evenly over the run, and the other slots are
filled by weighted draws.  Faults come in pairs where one undoes the other (budget shrink then grow, pool
create then delete): the second of a pair is a kind of its own, drawn only while its first is outstanding.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

WORKER_KILL: Final = "worker-kill"
KWOK_OOM: Final = "kwok-oom"
KWOK_CRASH: Final = "kwok-crash"
KWOK_LOAD_FAILED: Final = "kwok-load-failed"
OPERATOR_KILL: Final = "operator-kill"
GATEWAY_KILL: Final = "gateway-kill"
CONTROL_PLANE_RESTART: Final = "control-plane-restart"
POOL_EDIT: Final = "pool-edit"
POOL_CREATE: Final = "pool-create"
POOL_DELETE: Final = "pool-delete"
BUDGET_SHRINK: Final = "budget-shrink"
BUDGET_GROW: Final = "budget-grow"

KWOK_FAULTS: Final = (KWOK_OOM, KWOK_CRASH, KWOK_LOAD_FAILED)
#: How often each kind is drawn for a free slot (relative); the undoing halves are drawn only when due.
WEIGHTS: Final[dict[str, int]] = {
    WORKER_KILL: 4,
    KWOK_OOM: 2,
    KWOK_CRASH: 2,
    KWOK_LOAD_FAILED: 2,
    OPERATOR_KILL: 2,
    GATEWAY_KILL: 2,
    POOL_EDIT: 2,
    POOL_CREATE: 1,
    BUDGET_SHRINK: 1,
}
#: The fault that undoes each paired one.
UNDO: Final[dict[str, str]] = {POOL_CREATE: POOL_DELETE, BUDGET_SHRINK: BUDGET_GROW}
ALL_KINDS: Final = (*WEIGHTS, CONTROL_PLANE_RESTART, POOL_DELETE, BUDGET_GROW)


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: seconds after the faults begin, its kind, and a draw that picks its target."""

    at: float
    kind: str
    pick: int


def schedule(
    seed: int, seconds: float, spacing: float, required: dict[str, int] | None = None
) -> list[Fault]:
    """Faults every ``spacing`` seconds over ``seconds``; each kind in ``required`` at least that often.

    Every slot holds one fault.  An outstanding pair (a shrunk budget, a created pool) is undone within
    three slots, and always before the end, so the run's last state asks nothing the cluster cannot
    hold.  Raises ValueError when the required faults do not fit into the slots."""
    rng = random.Random(seed)
    slots = int(seconds // spacing)
    required = dict(required or {})
    # Every paired fault needs its undo slot too.
    needed = sum(n * (2 if kind in UNDO else 1) for kind, n in required.items())
    if needed > slots:
        raise ValueError(f"{needed} required faults do not fit into {slots} slots of {spacing:g}s")
    kinds: list[str | None] = [None] * slots
    _place_required(kinds, required, rng)
    _fill(kinds, rng)
    return [Fault(at=i * spacing, kind=k, pick=rng.randrange(1 << 30)) for i, k in enumerate(kinds) if k]


def _place_required(kinds: list[str | None], required: dict[str, int], rng: random.Random) -> None:
    """Spread each required kind evenly: the n-th of N in the n-th of N equal stretches (a free slot in
    it, a paired one with a free slot after it for the undo)."""
    for kind, count in sorted(required.items()):
        stretch = len(kinds) / count
        for n in range(count):
            lo, hi = int(n * stretch), max(int((n + 1) * stretch), int(n * stretch) + 1)
            free = [
                i for i in range(lo, min(hi, len(kinds))) if kinds[i] is None and _undo_fits(kinds, i, kind)
            ]
            if not free:
                free = [i for i in range(len(kinds)) if kinds[i] is None and _undo_fits(kinds, i, kind)]
            if not free:
                raise ValueError(f"no room for {kind}")
            i = rng.choice(free)
            kinds[i] = kind
            if kind in UNDO:
                kinds[_undo_slot(kinds, i)] = UNDO[kind]


def _undo_fits(kinds: list[str | None], i: int, kind: str) -> bool:
    return kind not in UNDO or any(k is None for k in kinds[i + 1 :])


def _undo_slot(kinds: list[str | None], i: int) -> int:
    """The first free slot after ``i``, at most three away when one is free there."""
    after = [j for j in range(i + 1, len(kinds)) if kinds[j] is None]
    near = [j for j in after if j - i <= 3]
    return (near or after)[0]


def _fill(kinds: list[str | None], rng: random.Random) -> None:
    names = list(WEIGHTS)
    weights = [WEIGHTS[n] for n in names]
    for i, kind in enumerate(kinds):
        if kind is not None:
            continue
        choice = rng.choices(names, weights)[0]
        if choice in UNDO:
            if not any(k is None for k in kinds[i + 1 :]):
                choice = WORKER_KILL  # no slot left to undo it in
            else:
                kinds[_undo_slot(kinds, i)] = UNDO[choice]
        kinds[i] = choice


def counts(faults: list[Fault]) -> dict[str, int]:
    """Faults by kind."""
    out: dict[str, int] = {}
    for fault in faults:
        out[fault.kind] = out.get(fault.kind, 0) + 1
    return out
