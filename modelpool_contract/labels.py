"""The ``modelpool.dev`` prefix, the labels and annotations worker pods carry, and their named parts.

The operator writes them (pod builder, eviction patch), reads them back (worker observation, the pod
watch's label selector) and a gateway selects serving workers by them; the prefix is also the API group
of the ModelPool and ModelBudget resources.  ``LABEL_POOL`` also names the pool of a demand Lease
(``modelpool_contract.demand``).
"""

from __future__ import annotations

from typing import Final

#: The API group, and the prefix of every label, annotation and finalizer the operator owns.
GROUP: Final = "modelpool.dev"
PREFIX: Final = GROUP

#: The pool a worker pod belongs to (every worker pod has it; the operator watches only such pods).
LABEL_POOL: Final = f"{PREFIX}/pool"
#: The worker's own name (its pod name).
LABEL_WORKER: Final = f"{PREFIX}/worker"
#: The hash of the spec fields that shaped the pod; a different hash means the worker is outdated.
LABEL_TEMPLATE_HASH: Final = f"{PREFIX}/template-hash"
#: "true" while the pool's Service may route to the worker; an eviction removes it first.
LABEL_SERVING: Final = f"{PREFIX}/serving"
#: The standard "managed by" label (value: the operator's name).
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"

#: Memory (bytes) the worker is charged; written by the pod builder so the ledger need not parse specs.
ANNOTATION_MEMORY: Final = f"{PREFIX}/memory-bytes"
#: Set when the operator decides to evict the worker; the value is the reason (IdleTimeout, ...).
ANNOTATION_EVICTING: Final = f"{PREFIX}/evicting"
#: When the eviction was decided (RFC 3339), so the drain grace is measured across passes and restarts.
ANNOTATION_EVICTING_SINCE: Final = f"{PREFIX}/evicting-since"
#: The worker's state as the operator observed it (its last ``/stats`` scrape and the pod) when it decided
#: the eviction, written in the same patch as ``ANNOTATION_EVICTING``: the record that lets an audit judge
#: "never a Loading or Processing worker" exactly (the published status lags the server by a scrape).
ANNOTATION_EVICTED_IN_STATE: Final = f"{PREFIX}/evicted-in-state"

#: The worker pod's one container, which runs the model server.
SERVER_CONTAINER: Final = "server"
#: The name of that container's HTTP port (the pool's Service and the gateway send traffic to it).
HTTP_PORT_NAME: Final = "http"
#: The name of its probe port (the kubelet's probes and the operator's ``/stats`` scrape use it).
PROBE_PORT_NAME: Final = "probes"
