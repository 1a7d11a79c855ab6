"""The names the gateway shares with the operator and the worker pods, in one place.

Labels, container and port names, the worker port and the worker states come from ``modelpool_contract``
(what the operator and the server agree on; the gateway must not import the operator, which pulls in
kopf).  The ModelPool resource's version and plural, the condition names and the activation timeout's
default are the operator API's (``modelpool_operator.api``), copied here; tests/test_contract.py keeps
the copies equal.  The demand annotation is the gateway's side of a contract the operator reads
(docs/gateway.md).
"""

from __future__ import annotations

from modelpool_contract.flags import WORKER_PORT
from modelpool_contract.labels import (
    GROUP,
    HTTP_PORT_NAME,
    LABEL_POOL,
    LABEL_SERVING,
    PREFIX,
    SERVER_CONTAINER,
)
from modelpool_contract.states import SERVING_STATES, STARTING_STATES

VERSION = "v1alpha1"
MODELPOOL_PLURAL = "modelpools"
# The operator's worker port when a pod names none.
DEFAULT_SERVER_PORT = WORKER_PORT

# Written by the gateway on a ModelPool that has a request waiting and no serving worker: an RFC 3339 UTC
# time.  The operator treats a value newer than its last scale-down as demand for at least one worker.
ANNOTATION_DEMANDED_AT = f"{PREFIX}/demanded-at"

# Pool status conditions the gateway explains a held request with.
CONDITION_BUDGET_EXCEEDED = "BudgetExceeded"
CONDITION_DEGRADED = "Degraded"

# spec.activationTimeoutSeconds when a pool's stored object has none (a CRD older than the field).
DEFAULT_ACTIVATION_TIMEOUT_SECONDS = 120

__all__ = [
    "ANNOTATION_DEMANDED_AT",
    "CONDITION_BUDGET_EXCEEDED",
    "CONDITION_DEGRADED",
    "DEFAULT_ACTIVATION_TIMEOUT_SECONDS",
    "DEFAULT_SERVER_PORT",
    "GROUP",
    "HTTP_PORT_NAME",
    "LABEL_POOL",
    "LABEL_SERVING",
    "MODELPOOL_PLURAL",
    "SERVER_CONTAINER",
    "SERVING_STATES",
    "STARTING_STATES",
    "VERSION",
]
