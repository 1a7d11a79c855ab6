"""The objects a pool or a ModelHost owns besides its pods: the headless Service, the NetworkPolicy, the
PodDisruptionBudget and the InferencePool. Each is written once per process and again only when what it
says changes (``effects.apply``: the run remembers what it wrote), so one deleted by someone would stay
gone until the operator restarts: a deleted NetworkPolicy silently left a pool's workers open. As
controller-runtime's ``Owns()`` does, the operator watches what it owns (``handlers.watch_owned``): the
deletion of one of its objects clears its owner's memory of that kind (``Bookkeeping.lose``) and pokes the
owner, whose next pass makes it again; an edit of what it wrote (its labels and spec) is undone the same
way (``observe.drift``), where before it stood until the operator next wrote that object.

* ``owned_resources``: the kinds watched, those the operator makes under its configuration only (a
  NetworkPolicy with ``network_policy_enabled``, an InferencePool with ``inference_pools_enabled``; Kopf
  watches the InferencePool API once its CRD exists), so its RBAC holds no watch it does not need.
* ``OWNED_SELECTOR``: the API server sends only the operator's own objects (its ``managed-by`` label).
* ``owner_of``: pure, which owner a watch event concerns (None: none of ours).
* ``forget_owned``: a run's memory of the objects deleted or edited, cleared before its pass.

Per watched object only a digest of its written fields is kept (``Bookkeeping.saw``), so a status write
(a PodDisruptionBudget's, at every pod change) wakes no pass; Kopf keeps no essence of them (``diffbase``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from modelpool_contract.labels import LABEL_MANAGED_BY, LABEL_POOL
from modelpool_contract.picker import INFERENCE_GROUP, INFERENCE_POOL_PLURAL, INFERENCE_VERSION
from modelpool_operator.bookkeeping import HostRun, PoolRun
from modelpool_operator.effects.resources import MANAGED_BY
from modelpool_operator.observe.drift import drifted
from modelpool_operator.observe.ownership import claimed_key
from modelpool_operator.pool import PoolKey

SERVICE: Final = "Service"
NETWORK_POLICY: Final = "NetworkPolicy"
DISRUPTION_BUDGET: Final = "PodDisruptionBudget"
INFERENCE_POOL: Final = "InferencePool"
#: The label selector of the owned objects' watches (server-side: no one else's object is sent).
OWNED_SELECTOR: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY}"


@dataclass(frozen=True)
class OwnedResource:
    """One kind of owned object, as Kopf names its resource (group ``""``: the core API)."""

    group: str
    version: str
    plural: str
    kind: str


SERVICES = OwnedResource("", "v1", "services", SERVICE)
NETWORK_POLICIES = OwnedResource("networking.k8s.io", "v1", "networkpolicies", NETWORK_POLICY)
DISRUPTION_BUDGETS = OwnedResource("policy", "v1", "poddisruptionbudgets", DISRUPTION_BUDGET)
INFERENCE_POOLS = OwnedResource(INFERENCE_GROUP, INFERENCE_VERSION, INFERENCE_POOL_PLURAL, INFERENCE_POOL)


def owned_resources(*, network_policies: bool, inference_pools: bool) -> tuple[OwnedResource, ...]:
    """Pure: the kinds to watch: those the operator makes under its configuration."""
    kinds = [SERVICES, DISRUPTION_BUDGETS]
    if network_policies:
        kinds.append(NETWORK_POLICIES)
    if inference_pools:
        kinds.append(INFERENCE_POOLS)
    return tuple(kinds)


def owner_of(namespace: str, meta: Mapping[str, Any], labels: Mapping[str, str]) -> PoolKey | None:
    """Pure: the daemon key of the pool (or ModelHost: ``host_charge_key``) that owns the object of a watch
    event, or None: not an object of ours (the operator's label, and a controller owner that is the pool or
    ModelHost its ``modelpool.dev/pool`` label names, as a worker's)."""
    if labels.get(LABEL_MANAGED_BY) != MANAGED_BY:
        return None
    pool = labels.get(LABEL_POOL)
    if not pool:
        return None
    return claimed_key(namespace, meta, pool)


def forget_owned(run: PoolRun | HostRun, lost: Mapping[str, Mapping[str, Any] | None]) -> None:
    """Clear the run's memory of each kind ``lost`` (``Bookkeeping.take_lost``): deleted (None), or edited
    (the object as seen: forgotten only where it no longer says what the run wrote, ``drift.drifted``).
    The next pass writes what is forgotten again. An InferencePool the run removed itself (``False``)
    stays removed: its deletion is the run's own."""
    for kind, live in lost.items():
        if kind == NETWORK_POLICY and _gone(run.network_policy, live):
            run.network_policy = None
        elif kind == DISRUPTION_BUDGET and _gone(run.disruption_budget, live):
            run.disruption_budget = None
        elif isinstance(run, PoolRun):
            if kind == SERVICE and _gone(run.service, live):
                run.service = None
            elif (
                kind == INFERENCE_POOL and run.inference_pool is not False and _gone(run.inference_pool, live)
            ):
                run.inference_pool = None


def _gone(written: Mapping[str, Any] | None, live: Mapping[str, Any] | None) -> bool:
    return live is None or written is None or drifted(written, live)
