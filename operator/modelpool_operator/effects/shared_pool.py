"""Applying a shared pool's pass (``reconcile_shared``): its status written, and the dedicated workers of a
pool switched to ``spec.host`` deleted (its model lives on its ModelHost's pods now), with the objects made
for them (``dedicated_objects``: the headless Service, the PodDisruptionBudget and the NetworkPolicy all
select the pool's own workers, which a shared pool has none of; its ModelHost's pods have their own)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from modelpool_contract.api import ModelPoolStatus
from modelpool_operator.bookkeeping import PoolRun
from modelpool_operator.effects.attempts import attempt
from modelpool_operator.effects.kube import merge_patch
from modelpool_operator.effects.network_policy import policy_name
from modelpool_operator.planner.shared import shared_wire
from modelpool_operator.pool import PoolView
from modelpool_operator.services import Services

logger = logging.getLogger(__name__)


async def delete_workers(services: Services, namespace: str, pods: list[Mapping[str, Any]]) -> None:
    """Delete a shared pool's dedicated workers (it was switched to ``spec.host``: its model lives on host
    pods now, and the workers' memory returns to the budget)."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = str(meta.get("name") or "")
        failure = await attempt("DeleteFailed", f"worker {name}", services.kube.delete_pod(namespace, name))
        if failure is not None:
            logger.warning("%s", failure.message)


def dedicated_objects(pool_name: str, *, network_policies: bool) -> list[tuple[str, str]]:
    """Pure: the objects (kind, name) a pool makes for its dedicated workers, which a shared pool keeps none
    of: its Service (no worker of its own to route to), its PodDisruptionBudget (none to protect: it would
    count no pod), and its NetworkPolicy where the operator makes them (none to fence). An InferencePool
    (``spec.inferencePool``) is the field's to keep or remove, whatever ``spec.host``."""
    objects = [("Service", pool_name), ("PodDisruptionBudget", policy_name(pool_name))]
    if network_policies:
        objects.append(("NetworkPolicy", policy_name(pool_name)))
    return objects


async def remove_dedicated_objects(services: Services, run: PoolRun, pool: PoolView) -> None:
    """Delete the shared pool's ``dedicated_objects`` (only those it controls: ``Kube.delete_owned``),
    once per process (a list per kind at each start: at most three requests per shared pool) and again
    after it was dedicated meanwhile; a failure is logged and tried again at the next pass. The run forgets
    having written them, so a switch back to dedicated makes them anew."""
    if run.dedicated_removed or not pool.uid:
        return
    failed = False
    for kind, name in dedicated_objects(pool.name, network_policies=services.config.network_policy_enabled):
        removal = services.kube.delete_owned(pool.namespace, kind, name, pool.uid)
        failure = await attempt("DeleteFailed", f"{kind} {name}", removal)
        if failure is not None:
            logger.warning("shared pool %s/%s: %s", pool.namespace, pool.name, failure.message)
            failed = True
    run.service, run.network_policy, run.disruption_budget = None, None, None
    run.dedicated_removed = not failed


async def write_pool_status(
    services: Services, run: PoolRun, previous: Mapping[str, Any], status: ModelPoolStatus
) -> None:
    """Bring a shared pool's status from ``previous`` (as last written) to ``status`` (nothing when equal).
    The merge patch removes what ``status`` does not set, so the status is then its wire form exactly."""
    wire = shared_wire(status)
    patch = merge_patch(previous, wire)
    if patch:
        await services.kube.patch_pool_status(run.key[0], run.key[1], patch)
    run.last_status, run.last_status_wire = None, wire
