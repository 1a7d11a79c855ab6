"""Kopf wiring: indices, watch-event pokes, one daemon per ModelPool, and the ModelBudget status writer.

Level-based: the daemons act on what the indices show (pods by pool, pools, budgets), never on an
event's diff, so a missed event or an operator restart loses nothing. Events only *wake* a daemon early
(via ``OperatorState.poke``); without them each pool still re-reconciles every few seconds. Each handler
is a few lines: the pass itself lives in ``reconcile``, the decisions in ``planner``/``lifecycle``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from modelpool_operator import kube as kube_api
from modelpool_operator.api import GROUP, MODELBUDGET_PLURAL, MODELPOOL_PLURAL, VERSION
from modelpool_operator.lifecycle import LABEL_POOL
from modelpool_operator.reconcile import (
    Observer,
    PoolRun,
    budget_status_wire,
    lifecycle_settings,
    pool_of,
    reconcile_pool,
    slim_pod,
    slim_pool,
)
from modelpool_operator.runtime import OperatorState, wait_for_wakeup
from modelpool_operator.settings import OperatorConfig, apply_to_kopf
from modelpool_operator.stats import StatsScraper

# A failing pass is retried after this long (plus the next event), not in a tight loop.
_ERROR_DELAY_S = 5.0
# After a wake-up, wait this long for more events before the pass.
_COALESCE_S = 0.3
_POOLS = (GROUP, VERSION, MODELPOOL_PLURAL)
_BUDGETS = (GROUP, VERSION, MODELBUDGET_PLURAL)


def make_memo(config: OperatorConfig) -> kopf.Memo:
    """The memo every handler shares (Kopf copies it shallowly per object: the state object is shared)."""
    return kopf.Memo(state=OperatorState(config=config))


def _state(memo: Any) -> OperatorState:
    state: OperatorState = memo.state
    return state


# ---- process lifecycle -------------------------------------------------------------------------------


@kopf.on.startup()
async def startup(*, settings: kopf.OperatorSettings, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    state = _state(memo)
    config = state.config
    apply_to_kopf(config, settings)
    state.kube = await kube_api.connect(config.request_timeout_seconds)
    state.scraper = StatsScraper(
        interval=config.stats_interval_seconds,
        timeout=config.stats_timeout_seconds,
        concurrency=config.stats_concurrency,
        backoff_cap=config.stats_unreachable_backoff_cap_seconds,
        default_port=config.server_port,
    )
    state.observer = Observer(lifecycle_settings(state))
    logger.info("modelpool-operator started: %s", config.model_dump_json())


@kopf.on.cleanup()
async def cleanup(*, memo: Any, **_: Any) -> None:
    state = _state(memo)
    if state.scraper is not None:
        await state.scraper.aclose()
    if state.kube is not None:
        await state.kube.close()


@kopf.on.probe(id="pools")
def probe_pools(*, memo: Any, **_: Any) -> int:
    """Reported on the liveness endpoint: how many pool daemons this process runs."""
    return len(_state(memo).wakeups)


# ---- indices (rebuilt from the cluster by Kopf on every start) ----------------------------------------


@kopf.index("pods", labels={LABEL_POOL: kopf.PRESENT})
def pods_by_pool(
    *, namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    return {(namespace or "", labels[LABEL_POOL]): slim_pod(body)}


@kopf.index(*_POOLS)
def pools_by_key(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    return {(namespace or "", name): slim_pool(body)}


@kopf.index(*_BUDGETS)
def budgets_by_name(*, name: str, spec: kopf.Spec, **_: Any) -> dict[str, dict[str, Any]]:
    return {name: dict(spec)}


# ---- watch events only wake the daemons ---------------------------------------------------------------


@kopf.on.event("pods", labels={LABEL_POOL: kopf.PRESENT})
def pod_changed(
    *, type: str, namespace: str | None, labels: kopf.Labels, status: kopf.Status, memo: Any, **_: Any
) -> None:
    state = _state(memo)
    key = pool_of(labels, namespace)
    if key is not None:
        state.poke(key)
    if type == "DELETED" or status.get("phase") in ("Failed", "Succeeded"):
        state.poke_waiting()  # its memory is free (or about to be): pools short of budget may fit now


@kopf.on.event(*_POOLS)
def pool_changed(*, namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    _state(memo).poke((namespace or "", name))


@kopf.on.event(*_BUDGETS)
def budget_changed(*, memo: Any, **_: Any) -> None:
    _state(memo).poke_waiting()


# ---- the per-pool daemon --------------------------------------------------------------------------------


@kopf.daemon(*_POOLS, cancellation_timeout=5.0)
async def pool_daemon(
    *,
    namespace: str | None,
    name: str,
    body: kopf.Body,
    memo: Any,
    logger: kopf.Logger,
    stopped: kopf.DaemonStopped,
    **indices: Any,
) -> None:
    # Kopf passes every index by its function's name: pods_by_pool, pools_by_key, budgets_by_name.
    state = _state(memo)
    run = PoolRun(key=(namespace or "", name))
    wakeup = state.wakeup(run.key)
    try:
        while not stopped:
            delay = state.config.stats_interval_seconds
            try:
                plan = await reconcile_pool(
                    state,
                    observer=state.require_observer(),
                    run=run,
                    body=body,
                    pods_by_pool=indices["pods_by_pool"],
                    pools_by_key=indices["pools_by_key"],
                    budgets=indices["budgets_by_name"],
                )
                if plan is not None and plan.requeue_after is not None:
                    delay = min(delay, max(plan.requeue_after, 0.2))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one bad pass must not kill the pool's daemon; retry shortly
                logger.exception("reconciliation failed; retrying in %.0fs", _ERROR_DELAY_S)
                kopf.event(body, type="Warning", reason="ReconcileError", message=str(exc)[:1000])
                delay = _ERROR_DELAY_S
            woken = await wait_for_wakeup(
                wakeup, min(delay, state.config.resync_interval_seconds), stopped.wait()
            )
            if woken:
                # Coalesce a burst of pod events (a scale-up readies many pods at once) into one pass.
                await asyncio.sleep(_COALESCE_S)
                wakeup.clear()
    finally:
        state.forget(run.key)


# ---- the ModelBudget status writer ---------------------------------------------------------------------


@kopf.daemon(
    *_BUDGETS, cancellation_timeout=5.0, when=lambda name, memo, **_: name == _state(memo).config.budget_name
)
async def budget_daemon(
    *,
    name: str,
    status: kopf.Status,
    memo: Any,
    logger: kopf.Logger,
    stopped: kopf.DaemonStopped,
    **indices: Any,
) -> None:
    state = _state(memo)
    written: dict[str, Any] | None = None
    while not stopped:
        try:
            wire = budget_status_wire(
                state, state.require_observer(), indices["pods_by_pool"], indices["budgets_by_name"]
            )
            patch = kube_api.merge_patch(written if written is not None else dict(status), wire)
            if patch:
                await state.require_kube().patch_budget_status(name, patch)
            written = wire
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("writing the ModelBudget status failed; retrying")
        await wait_for_wakeup(state.budget_wakeup, state.config.resync_interval_seconds, stopped.wait())
        # Coalesce bursts (a scale-up of many pods) into one write.
        await asyncio.sleep(0.5)
