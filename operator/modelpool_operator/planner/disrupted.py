"""Pod names a drain's eviction still holds in a PodDisruptionBudget (pure).

The Eviction API records an evicted pod by its *name* (not its uid) in its budget's
``status.disruptedPods``, and the disruption controller counts no pod of that name as healthy until either
it has seen the old pod being deleted or gone (it then drops the entry) or ``DELETION_TIMEOUT_S`` (its
``DeletionTimeout``, 2 min) has passed since the eviction. The operator's pod names are deterministic (a
worker takes the first free index, ``Draft.next_name``; a host pod is ``<host>-<index>``), so the
replacement of an evicted pod took the evicted one's name: when the old pod went before the controller
synced (KWOK deletes a pod at once; a busy controller-manager lags), the replacement, Ready, counted for
nothing for up to 2 min, and ``kubectl drain`` waited that long for its next eviction (test_drain, under
load).

A name whose pod was last seen Ready and selected by its budget (``budgeted``: the Eviction API records
only such pods) and is now being deleted or gone is *held* (``held_names``) for ``DELETION_TIMEOUT_S``:

* a pool's replacement worker takes another index meanwhile (its name is free of the budget's record, so
  it counts once Ready). The operator's own evictions drop the serving label first, so the budget never
  selected those at their end, and their names are reused as before;
* a host pod must keep its name (its index is its identity), so its replacement waits while the budget,
  read afresh, still lists the name (``still_listed``): until the controller has seen the old pod gone,
  normally within a second, never past the timeout.

Held names are the process's memory (``PoolRun``, ``HostRun``): a restarted operator forgets them, and a
replacement then waits at worst as long as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from modelpool_operator.observe.worker_state import ObservedWorker

#: The disruption controller's ``DeletionTimeout``: how long an evicted pod's name may stay in its budget's
#: ``status.disruptedPods`` (kubernetes pkg/controller/disruption).
DELETION_TIMEOUT_S = 120.0
_TIMEOUT = timedelta(seconds=DELETION_TIMEOUT_S)


def budgeted(pods: Iterable[ObservedWorker], *, labelled: bool = True) -> frozenset[str]:
    """The pods an eviction through their budget would record: Ready (the pod's condition), not being
    deleted, not being evicted by the operator, and (``labelled``: a pool's budget selects its serving
    workers) with the serving label. A ModelHost's budget selects every host pod (``labelled=False``)."""
    return frozenset(
        w.name
        for w in pods
        if (w.serving or not labelled)
        and w.ready_since is not None
        and not w.deleting
        and w.evicting_reason is None
    )


def held_names(
    before: frozenset[str],
    present: Mapping[str, bool],
    held: Mapping[str, datetime],
    now: datetime,
) -> dict[str, datetime]:
    """The names held now (name -> since when): those of ``held`` within ``DELETION_TIMEOUT_S``, and those
    ``budgeted`` at the last pass (``before``) whose pod is now being deleted or gone (``present``: each pod
    by name -> whether it is being deleted)."""
    still = {name: since for name, since in held.items() if now - since < _TIMEOUT}
    for name in before:
        if present.get(name, True) and name not in still:
            still[name] = now
    return still


def still_listed(
    held: Mapping[str, datetime], listed: Mapping[str, datetime], now: datetime
) -> dict[str, datetime]:
    """The ``held`` names the budget's ``status.disruptedPods`` (``listed``: name -> when evicted) still
    records within ``DELETION_TIMEOUT_S`` of the eviction: a pod of that name made now would count for
    nothing. A name no longer listed is free at once: the controller has seen its pod go."""
    return {name: since for name, since in held.items() if name in listed and now - listed[name] < _TIMEOUT}
