"""The names the gateway shares with the operator and the worker pods, in one place.

Labels, the demand annotation, container and port names, the worker port and the worker states come from
``modelpool_contract`` (what the operator, the server and the gateway agree on; the gateway must not
import the operator, which pulls in kopf).  The ModelPool resource's version and plural, the condition
names and the spec defaults are the operator API's (``modelpool_operator.api``), copied here;
tests/test_contract.py keeps the copies equal.
"""

from __future__ import annotations

from modelpool_contract.flags import WORKER_PORT
from modelpool_contract.labels import (
    ANNOTATION_DEMANDED_AT,
    GROUP,
    HTTP_PORT_NAME,
    LABEL_POOL,
    LABEL_SERVING,
    SERVER_CONTAINER,
)
from modelpool_contract.states import SERVING_STATES, STARTING_STATES

VERSION = "v1alpha1"
MODELPOOL_PLURAL = "modelpools"
# The operator's worker port when a pod names none.
DEFAULT_SERVER_PORT = WORKER_PORT

# The spec defaults the gateway needs to tell whether the operator wakes a pool at zero (modelpool_operator
# .api: replicas, minReplicas, maxReplicas; autoscaling is on when maxReplicas > minReplicas unless set).
DEFAULT_REPLICAS = 1
DEFAULT_MIN_REPLICAS = 0
DEFAULT_MAX_REPLICAS = 10

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
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_MIN_REPLICAS",
    "DEFAULT_REPLICAS",
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
