"""Applying a ModelHost's pass (``planner.hosts.HostPlan``): its control key Secret (made once, its key
derived from the operator's seed, ``control_keys``; never read back), the host pods to delete and to
create (their reservations end as a worker's do: ``effects.apply``), the host pods' NetworkPolicy
(``effects.apply.ensure_host_network_policy``), the status, and a Warning Event while the budget holds
host pods back.

Nothing here decides: ``reconcile_host.reconcile_host`` planned the pass and recorded the reservations.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from modelpool_operator.bookkeeping import Bookkeeping, HostRun
from modelpool_operator.control_keys import derive_control_key
from modelpool_operator.effects.apply import ApiFailure, _attempt, _create, ensure_host_network_policy
from modelpool_operator.effects.kube import describe_error, merge_patch
from modelpool_operator.effects.resources import build_control_key_secret, build_host_pod
from modelpool_operator.host import HostView, host_pod_name
from modelpool_operator.planner import Event
from modelpool_operator.planner.hosts import HostPlan
from modelpool_operator.pool import PoolKey
from modelpool_operator.services import Services, pod_settings


async def ensure_control_key(
    services: Services, run: HostRun, host: HostView, keys: dict[PoolKey, str] | None = None
) -> ApiFailure | None:
    """The host's control key Secret, created once with the key derived from the operator's seed
    (``control_keys.derive_control_key``; an existing Secret is kept: an earlier process derived the same
    key). The key is kept in ``keys`` (the bookkeeping's ``control_keys``) for the control calls. No Secret
    is ever read: the operator is granted only ``create`` on Secrets."""
    if run.secret_ready:
        return None
    key = derive_control_key(services.control_seed, host.namespace, host.name, host.uid)
    secret = build_control_key_secret(host, key)
    try:
        await services.kube.create_secret(host.namespace, secret)
    except Exception as exc:
        return ApiFailure(
            "SecretFailed", f"Secret {secret['metadata']['name']}: {describe_error(exc)}"[:1000]
        )
    run.secret_ready = True
    if keys is not None:
        keys[host.key] = key
    return None


async def apply_host(
    plan: HostPlan,
    services: Services,
    book: Bookkeeping,
    *,
    run: HostRun,
    host: HostView,
    body: Mapping[str, Any],
    now: datetime,
) -> list[ApiFailure]:
    """Make the ModelHost's ``plan`` so; returns the requests that failed (the pass goes on past each)."""
    kube = services.kube
    failures: list[ApiFailure | None] = [await ensure_control_key(services, run, host, book.control_keys)]
    for name in plan.delete:
        failures.append(
            await _attempt("DeleteFailed", f"host pod {name}", kube.delete_pod(host.namespace, name))
        )
    settings = pod_settings(services.config)
    creates = [(host_pod_name(host, i), build_host_pod(host, i, settings)) for i in plan.create]
    failures += await asyncio.gather(
        *(
            _attempt("CreateFailed", f"host pod {name}", _create(services, book, host.namespace, name, pod))
            for name, pod in creates
        )
    )
    # After the creations, as a pool's: the policy never holds up a host pod.
    failures.append(await ensure_host_network_policy(services, run, host))
    if plan.create or plan.delete:
        book.budget_wakeup.set()
    wire = plan.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    previous = run.last_status_wire if run.last_status_wire is not None else dict(body.get("status") or {})
    patch = merge_patch(previous, wire)
    if patch:
        await kube.patch_host_status(host.namespace, host.name, patch)
    run.last_status_wire = wire
    services.metrics.host_written(host.namespace, host.name, plan.status)
    if plan.short and plan.short != run.short:
        services.events.post(
            body,
            Event(
                "Warning",
                "BudgetExceeded",
                f"{plan.short} host pod(s) wait for the ModelBudget (each is charged its whole devices)",
            ),
        )
    run.short = plan.short
    book.waits_for_budget(host.charge_key, plan.short > 0)
    failed = [f for f in failures if f is not None]
    for failure in failed:
        services.events.post(body, Event("Warning", failure.reason, failure.message))
    return failed
