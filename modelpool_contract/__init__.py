"""What the operator and the model server agree on, in one place that both import.

The operator never imports the server (torch would land in the operator image) and the server never
imports Kopf, so every name that crosses the process boundary lives here, free of both: only the
standard library and pydantic.

* ``labels``: the ``modelpool.dev`` prefix, and the labels and annotations on worker pods.
* ``states``: the ten worker states and the named sets of them (serving, dormant, active, evictable,
  sleepable, charged).
* ``tasks``: the task names a ModelPool may ask for and the server implements.
* ``exits``: the server's exit codes the operator reads back from a terminated container, and its
  worst-case shutdown (the pod's grace period).
* ``stats``: the ``GET /stats`` document (``WorkerStats``) the server emits and the operator parses.
* ``flags``: the server flags the operator passes to a worker (``ServerArgs``) and their defaults.
* ``gateway_keys``: the label and data keys of the Secrets that hold the gateway's API keys.
* ``mounts``: where worker pods mount ``pvc://`` claims and the model cache, and the one parser of
  ``pvc://`` sources.
* ``api``: the ModelPool and ModelBudget resources as pydantic models (the operator generates the CRDs
  from them and reconciles with them; the gateway reads pools with them), with ``quantity``, the
  Kubernetes quantities they validate.
* ``demand``: the Lease a gateway renews while it holds requests for a pool, which the operator watches
  to wake a pool at zero.
* ``logs``: the one log format of every program (JSON or plain lines) and the request's ids in every line
  logged while it is served; ``request_ids``: the ASGI middleware that takes, makes, forwards and answers
  ``x-request-id`` (standard library only, as ``logs``).
* ``http_limits``: the bound on a request's header block that both HTTP front doors (the server's and the
  gateway's) enforce, as a uvicorn protocol.  The one module here beyond the standard library and
  pydantic: it imports uvicorn, so this package's ``__init__`` never imports it and the operator never
  does (``tests/test_contract.py`` checks what importing the contract loads).

The gateway imports this package too (never the operator): the labels, the states, the API types and the
demand Lease.

``docs/design.md`` ("Contracts") describes each of them.
"""

from modelpool_contract.exits import EXIT_CONFIG, EXIT_DEVICE_FAILED, EXIT_LOAD_FAILED
from modelpool_contract.flags import DEFAULT_SERVER_IMAGE, WORKER_PORT, ServerArgs
from modelpool_contract.labels import (
    ANNOTATION_EVICTING,
    ANNOTATION_EVICTING_SINCE,
    ANNOTATION_MEMORY,
    GROUP,
    LABEL_MANAGED_BY,
    LABEL_POOL,
    LABEL_SERVING,
    LABEL_TEMPLATE_HASH,
    LABEL_WORKER,
    PREFIX,
)
from modelpool_contract.states import (
    ACTIVE_STATES,
    CHARGED_STATES,
    DEVICE_CHARGED_STATES,
    DORMANT_STATES,
    EVICTABLE_STATES,
    SERVING_STATES,
    SLEEPABLE_STATES,
    STARTING_STATES,
    WORKER_STATES,
    WorkerState,
)
from modelpool_contract.stats import STATS_PATH, STATS_VERSION, WorkerStats
from modelpool_contract.tasks import TASK_NAMES, TaskName

__all__ = [
    "ACTIVE_STATES",
    "ANNOTATION_EVICTING",
    "ANNOTATION_EVICTING_SINCE",
    "ANNOTATION_MEMORY",
    "CHARGED_STATES",
    "DEFAULT_SERVER_IMAGE",
    "DEVICE_CHARGED_STATES",
    "DORMANT_STATES",
    "EVICTABLE_STATES",
    "EXIT_CONFIG",
    "EXIT_DEVICE_FAILED",
    "EXIT_LOAD_FAILED",
    "GROUP",
    "LABEL_MANAGED_BY",
    "LABEL_POOL",
    "LABEL_SERVING",
    "LABEL_TEMPLATE_HASH",
    "LABEL_WORKER",
    "PREFIX",
    "SERVING_STATES",
    "SLEEPABLE_STATES",
    "STARTING_STATES",
    "STATS_PATH",
    "STATS_VERSION",
    "TASK_NAMES",
    "WORKER_PORT",
    "WORKER_STATES",
    "ServerArgs",
    "TaskName",
    "WorkerState",
    "WorkerStats",
]
