"""Applying a shared pool's pass (``reconcile_shared``): its status written, and the dedicated workers of a
pool switched to ``spec.host`` deleted (its model lives on its ModelHost's pods now)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from modelpool_contract.api import ModelPoolStatus
from modelpool_operator.bookkeeping import PoolRun
from modelpool_operator.effects.attempts import attempt
from modelpool_operator.effects.kube import merge_patch
from modelpool_operator.planner.shared import shared_wire
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
