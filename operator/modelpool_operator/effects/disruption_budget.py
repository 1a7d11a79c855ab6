"""Pure builders of the PodDisruptionBudgets of a pool's workers and of a ModelHost's host pods.

One per dedicated ModelPool (``modelpool-<pool>``) and one per ModelHost (``modelhost-<host>``), in its
namespace, owned by it (deleted with it), as its NetworkPolicy is named. A shared pool (``spec.host``) has
no pods of its own and no budget: its ModelHost's covers the host pods.

* **What it selects.** A pool's *serving* workers (``modelpool.dev/pool=<pool>``, ``modelpool.dev/serving=
  true``): a worker the operator is evicting has lost its serving label, so it is neither protected nor
  counted as serving. A ModelHost's host pods (``modelpool.dev/pool=host_<host>``).
* **minAvailable, not maxUnavailable.** ``spec.disruption.maxUnavailable`` is the user's number, but a
  PodDisruptionBudget's own ``maxUnavailable`` counts from its pods' controller's scale subresource, whose
  ``spec.replicas`` is only a starting count on an autoscaled pool: with 10 workers and ``replicas: 1``,
  a drain could evict every one at once. The operator knows the count it aims for (``targetReplicas``)
  and writes ``minAvailable = max(0, target - maxUnavailable)``, an integer, which the disruption controller
  compares with the ready pods alone. The operator patches it when the target moves.
* **unhealthyPodEvictionPolicy: AlwaysAllow.** A pod that is not Ready (Pending, pulling, a model still
  Loading, a wedged server) serves nothing: evicting it loses no capacity, and under the default policy a
  drain of its node would wait until it became Ready, which a model that takes half an hour to load (or
  never loads) turns into a drain blocked for as long. The budget protects serving pods only.

Nothing here calls the API; ``effects.apply`` builds and ``effects.kube`` sends.
"""

from __future__ import annotations

from typing import Any

from modelpool_contract.labels import LABEL_MANAGED_BY, LABEL_POOL, LABEL_SERVING
from modelpool_operator.effects.network_policy import host_policy_name, policy_name
from modelpool_operator.effects.resources import (
    MANAGED_BY,
    host_labels,
    host_owner_reference,
    owned_metadata,
    owner_reference,
)
from modelpool_operator.host import HostView, host_pool_label
from modelpool_operator.pool import PoolView

#: The eviction policy of every budget the operator makes (see the module docstring).
UNHEALTHY_POD_EVICTION_POLICY = "AlwaysAllow"


def min_available(target: int, max_unavailable: int) -> int:
    """Pure: the serving pods a drain must leave: the target less what may be down, never below zero."""
    return max(0, target - max_unavailable)


def _budget(metadata: dict[str, Any], selector: dict[str, str], minimum: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata,
        "spec": {
            "minAvailable": minimum,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": UNHEALTHY_POD_EVICTION_POLICY,
        },
    }


def build_pool_budget(pool: PoolView, target: int) -> dict[str, Any]:
    """The PodDisruptionBudget of ``pool``'s serving workers while it aims for ``target`` of them."""
    labels = {LABEL_POOL: pool.name, LABEL_MANAGED_BY: MANAGED_BY}
    metadata = owned_metadata(policy_name(pool.name), pool.namespace, labels, owner_reference(pool))
    selector = {LABEL_POOL: pool.name, LABEL_SERVING: "true"}
    return _budget(metadata, selector, min_available(target, pool.spec.disruption.max_unavailable))


def build_host_budget(host: HostView) -> dict[str, Any]:
    """The PodDisruptionBudget of ``host``'s host pods (its ``spec.replicas`` is their count)."""
    metadata = owned_metadata(
        host_policy_name(host.name), host.namespace, host_labels(host), host_owner_reference(host)
    )
    spec = host.spec
    selector = {LABEL_POOL: host_pool_label(host.name)}
    return _budget(metadata, selector, min_available(spec.replicas, spec.disruption.max_unavailable))
