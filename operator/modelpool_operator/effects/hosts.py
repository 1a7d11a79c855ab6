"""Applying a ModelHost's pass (``planner.hosts.HostPlan``): its control key Secret (made once, its key
derived from the operator's seed, ``control_keys``; never read back), the host pods to delete and to
create (their reservations end as a worker's do: ``effects.apply``), the host pods' NetworkPolicy
(``effects.apply.ensure_host_network_policy``) and PodDisruptionBudget
(``effects.apply.ensure_host_disruption_budget``), the status (with the ApiError condition, as a pool's), and
Warning Events: the budget holding host pods back, and each failed request when it is new. And the one
read of a pass: the ModelHost's PodDisruptionBudget's record of evicted pods (``disrupted_pods``), while a
drained host pod's name is held (``reconcile_host.hold_disrupted``).

A Secret of the control key's name that is not the ModelHost's (someone made it first, with a key they
know: ``effects.kube.ensure_control_key_secret``) is NameTaken: no host pod is created while it lasts
(a host pod mounts the Secret by name, and would obey whoever wrote it), and the Secret is tried again
with a doubling delay (the operator's backoffBaseSeconds to backoffCapSeconds).

Nothing here decides: ``reconcile_host.reconcile_host`` planned the pass and recorded the reservations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from modelpool_contract.api import Condition, ModelHostStatus
from modelpool_operator.bookkeeping import Bookkeeping, HostRun
from modelpool_operator.control_keys import derive_control_key
from modelpool_operator.effects.apply import (
    api_condition,
    create_reserved,
    ensure_host_disruption_budget,
    ensure_host_network_policy,
)
from modelpool_operator.effects.attempts import NAME_TAKEN, ApiFailure, attempt
from modelpool_operator.effects.kube import NameTakenError, describe_error, merge_patch
from modelpool_operator.effects.network_policy import host_policy_name
from modelpool_operator.effects.resources import build_control_key_secret, build_host_pod
from modelpool_operator.host import HostView, host_pod_name
from modelpool_operator.planner import Event
from modelpool_operator.planner.hosts import HostPlan
from modelpool_operator.planner.phases import backoff_delay
from modelpool_operator.pool import PoolKey
from modelpool_operator.services import Services, pod_settings

logger = logging.getLogger(__name__)


async def disrupted_pods(services: Services, host: HostView) -> dict[str, datetime] | None:
    """The ModelHost's PodDisruptionBudget's ``status.disruptedPods`` now (``planner.disrupted``); None when
    it could not be read (the answer went to the API error hook; the next pass asks again)."""
    try:
        return await services.kube.disrupted_pods(host.namespace, host_policy_name(host.name))
    except Exception as exc:
        logger.info("ModelHost %s/%s: its PodDisruptionBudget unread: %s", host.namespace, host.name, exc)
        return None


async def ensure_control_key(
    services: Services,
    run: HostRun,
    host: HostView,
    keys: dict[PoolKey, str] | None = None,
    clock: float | None = None,
) -> ApiFailure | None:
    """The host's control key Secret, created once with the key derived from the operator's seed
    (``control_keys.derive_control_key``), or an existing one of the ModelHost's brought to that key (an
    earlier process made it). The key is kept in ``keys`` (the bookkeeping's ``control_keys``) for the
    control calls only once the Secret is known to hold it. No Secret is ever read.

    A failure (NameTaken: the Secret is someone else's; or the API's answer) is returned, and the Secret is
    not tried again before a doubling delay (``run.secret_retry_at``, monotonic ``clock``): until then
    the same failure is returned without a request."""
    if run.secret_ready:
        return None
    clock = time.monotonic() if clock is None else clock
    if run.secret_failure is not None and clock < run.secret_retry_at:
        return run.secret_failure
    key = derive_control_key(services.control_seed, host.namespace, host.name, host.uid)
    secret = build_control_key_secret(host, key)
    try:
        await services.kube.ensure_control_key_secret(host.namespace, secret)
    except NameTakenError as exc:
        failure = ApiFailure(NAME_TAKEN, str(exc))
    except Exception as exc:
        what = f"Secret {secret['metadata']['name']}"
        failure = ApiFailure("SecretFailed", f"{what}: {describe_error(exc)}")
    else:
        run.secret_ready, run.secret_failure, run.secret_failures = True, None, 0
        if keys is not None:
            keys[host.key] = key
        return None
    run.secret_failures += 1
    config = services.config
    delay = backoff_delay(run.secret_failures, config.backoff_base_seconds, config.backoff_cap_seconds)
    run.secret_failure, run.secret_retry_at = failure, clock + delay
    return failure


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
    key_failure = await ensure_control_key(services, run, host, book.control_keys)
    failures: list[ApiFailure | None] = [key_failure]
    for name in plan.delete:
        failures.append(
            await attempt("DeleteFailed", f"host pod {name}", kube.delete_pod(host.namespace, name))
        )
    settings = pod_settings(services.config)
    creates = [(host_pod_name(host, i), build_host_pod(host, i, settings)) for i in plan.create]
    if key_failure is not None:  # no host pod mounts a Secret that is not known to hold our key
        for name, _ in creates:
            book.reservations.release(host.namespace, name)
        creates = []
    failures += await asyncio.gather(
        *(
            attempt(
                "CreateFailed", f"host pod {name}", create_reserved(services, book, host.namespace, name, pod)
            )
            for name, pod in creates
        )
    )
    # After the creations, as a pool's: the policy never holds up a host pod.
    failures.append(await ensure_host_network_policy(services, run, host))
    failures.append(await ensure_host_disruption_budget(services, run, host))
    if plan.create or plan.delete:
        book.budget_wakeup.set()
    failed = [f for f in failures if f is not None]
    status = with_host_api_condition(plan.status, body, host, failed, now)
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True)
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
                f"{plan.short} host pod(s) wait for the ModelBudget (each is charged its whole devices)"
                + (f": {plan.closed}" if plan.closed else ""),
            ),
        )
    run.short = plan.short
    book.waits_for_budget(host.charge_key, plan.short > 0)
    # Each failure told when it is new, not at every pass while it lasts (the condition shows it).
    told = {(f.reason, f.message) for f in failed}
    for reason, message in sorted(told - run.api_failures):
        services.events.post(body, Event("Warning", reason, message))
    run.api_failures = told
    return failed


def with_host_api_condition(
    status: ModelHostStatus, body: Mapping[str, Any], host: HostView, failed: list[ApiFailure], now: datetime
) -> ModelHostStatus:
    """The planned status with the ApiError condition (``effects.apply.api_condition``), its transition
    time kept from the status as stored."""
    stored = (body.get("status") or {}).get("conditions") or []
    previous: list[Condition] = []
    for entry in stored:
        try:
            previous.append(Condition.model_validate(entry))
        except ValueError:
            continue
    api_error = api_condition(previous, failed, now, host.generation)
    kept = [c for c in status.conditions if c.type != api_error.type]
    return status.model_copy(update={"conditions": [*kept, api_error]})
