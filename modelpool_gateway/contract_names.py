"""The names the gateway shares with the operator and the worker pods, in one place.

Copied from the operator (``modelpool_operator.api``, ``.lifecycle``, ``.resources``), which the gateway
must not import (it pulls in kopf); tests/test_contract.py keeps the copies equal.  The demand annotation
is the gateway's side of a contract the operator reads (docs/gateway.md).
"""

from __future__ import annotations

GROUP = "modelpool.dev"
VERSION = "v1alpha1"
MODELPOOL_PLURAL = "modelpools"

# Every worker pod carries its pool's name; the operator removes the serving label before it drains one.
LABEL_POOL = "modelpool.dev/pool"
LABEL_SERVING = "modelpool.dev/serving"
# The worker container and its HTTP port's name in the pods the operator builds.
SERVER_CONTAINER = "server"
HTTP_PORT_NAME = "http"
# The operator's worker port when a pod names none (PodSettings.port).
DEFAULT_SERVER_PORT = 8000

# Written by the gateway on a ModelPool that has a request waiting and no serving worker: an RFC 3339 UTC
# time.  The operator treats a value newer than its last scale-down as demand for at least one worker.
ANNOTATION_DEMANDED_AT = "modelpool.dev/demanded-at"

# Pool status: worker states and the budget condition the gateway explains a held request with.
STARTING_STATES = ("Pending", "Loading")
SERVING_STATES = ("Ready", "Processing", "Idle")
CONDITION_BUDGET_EXCEEDED = "BudgetExceeded"
CONDITION_DEGRADED = "Degraded"

# spec.activationTimeoutSeconds when a pool's stored object has none (a CRD older than the field).
DEFAULT_ACTIVATION_TIMEOUT_SECONDS = 120
