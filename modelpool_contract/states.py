"""The eight worker states, and the sets of them that the operator and the server reason with.

The server decides its own state (Loading, Ready, Processing, Idle, Evicting, Dead, Failed) and reports
it in ``/stats``; the operator adds what only the cluster knows (Pending before the container runs,
Failed for a kubelet verdict) and writes the result into ``status.workers[].state``.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

WorkerState = Literal["Pending", "Loading", "Ready", "Processing", "Idle", "Evicting", "Dead", "Failed"]
WORKER_STATES: Final[tuple[WorkerState, ...]] = get_args(WorkerState)

#: Can answer requests: the readiness probe passes and the pool's Service routes to it.
SERVING_STATES: Final[frozenset[WorkerState]] = frozenset({"Ready", "Processing", "Idle"})
#: Not serving yet: the pod waits to run, or the model loads.
STARTING_STATES: Final[frozenset[WorkerState]] = frozenset({"Pending", "Loading"})
#: Counts towards the pool's workers (replicas): exists, has not failed, is not on its way out.
ACTIVE_STATES: Final[frozenset[WorkerState]] = STARTING_STATES | SERVING_STATES
#: May be chosen for eviction (when nothing is queued or in flight): never Loading or Processing, whose
#: work would be lost.
EVICTABLE_STATES: Final[frozenset[WorkerState]] = frozenset({"Ready", "Idle"})
#: Holds its memory and is charged against the budget: everything but a failed or finished worker.
CHARGED_STATES: Final[frozenset[WorkerState]] = ACTIVE_STATES | {"Evicting"}
