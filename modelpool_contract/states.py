"""The ten worker states, and the sets of them that the operator, the gateway and the server reason with.

The server decides its own state (Loading, Ready, Processing, Idle, Sleeping, Waking, Evicting, Dead,
Failed) and reports it in ``/stats``; the operator adds what only the cluster knows (Pending before the
container runs, Failed for a kubelet verdict) and writes the result into ``status.workers[].state``.
Sleeping and Waking happen only to a model on a shared host (``modelpool-server --host``): its weights
parked in host memory and its device memory returned, or on their way back.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

WorkerState = Literal[
    "Pending", "Loading", "Ready", "Processing", "Idle", "Sleeping", "Waking", "Evicting", "Dead", "Failed"
]
WORKER_STATES: Final[tuple[WorkerState, ...]] = get_args(WorkerState)

#: Can answer requests: the readiness probe passes and the pool's Service routes to it.
SERVING_STATES: Final[frozenset[WorkerState]] = frozenset({"Ready", "Processing", "Idle"})
#: Not serving yet: the pod waits to run, or the model loads.
STARTING_STATES: Final[frozenset[WorkerState]] = frozenset({"Pending", "Loading"})
#: Loaded on a shared host with its weights parked in host memory (Sleeping), or on their way back to the
#: device (Waking): a request wakes it there, so it still holds the model.
DORMANT_STATES: Final[frozenset[WorkerState]] = frozenset({"Sleeping", "Waking"})
#: Counts towards the pool's workers (replicas): exists, has not failed, is not on its way out.
ACTIVE_STATES: Final[frozenset[WorkerState]] = STARTING_STATES | SERVING_STATES | DORMANT_STATES
#: May be chosen for eviction (when nothing is queued or in flight): never Loading, Processing or Waking,
#: whose work would be lost.  Evicting a Sleeping model unloads it (its next request is a cold load).
EVICTABLE_STATES: Final[frozenset[WorkerState]] = frozenset({"Ready", "Idle", "Sleeping"})
#: May be put to sleep (to make room on its device): idle or ready with nothing in hand, never Loading,
#: Processing or Waking.
SLEEPABLE_STATES: Final[frozenset[WorkerState]] = frozenset({"Ready", "Idle"})
#: Holds its memory and is charged against the budget: everything but a failed or finished worker.
CHARGED_STATES: Final[frozenset[WorkerState]] = ACTIVE_STATES | {"Evicting"}
#: Charged accelerator (device) memory: a Sleeping model is charged host memory instead.
DEVICE_CHARGED_STATES: Final[frozenset[WorkerState]] = CHARGED_STATES - {"Sleeping"}
