"""Applying a ModelHost pass's decision on its host pods' models (``planner.host_models.ModelCalls``): the
control calls on its host pods (``services.host_control``, with the ModelHost's control key) and the
``modelpool.dev/models`` annotation of each host pod, written when it changed (a merge patch of the pod's
metadata); a deleted shared pool's model unloaded everywhere (``unload_everywhere``).

Sleeps and unloads are awaited in order (each is a few seconds at most); a load lasts until the model
serves, so each runs as a task of its own (``HostRun.loading``), and the ModelHost's daemon is poked when
it ends: the next pass sees the model in the host's ``/stats``. A failed call is told as a Warning Event
on the ModelHost (naming the pool and the host pod) and on the pool (naming the host pod; a pass's
sleeps and unloads one Event per reason and pool, ``tell_pools``), and not tried again there for a while
(``HostRun.backoff``). Without the control key no call is made, and an Event says why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from modelpool_contract.api import MODELHOST_KIND
from modelpool_contract.placements import ANNOTATION_MODELS
from modelpool_operator.bookkeeping import Bookkeeping, HostRun
from modelpool_operator.control_keys import derive_control_key
from modelpool_operator.effects.attempts import attempt
from modelpool_operator.effects.host_control import ControlError
from modelpool_operator.host import HostView
from modelpool_operator.owners import controller_owner
from modelpool_operator.planner import Event
from modelpool_operator.planner.host_models import Control, ModelCalls
from modelpool_operator.planner.host_pass import HostPassPlan
from modelpool_operator.planner.status import coalesce
from modelpool_operator.services import Services

logger = logging.getLogger(__name__)

#: A (host pod, pool) whose control call failed is not tried again before this many seconds.
BACKOFF_S = 15.0


@dataclass(frozen=True)
class HostModels:
    """What a ModelHost pass's models effects act on, built once per pass (``reconcile_host.models_of``)."""

    services: Services
    book: Bookkeeping
    run: HostRun
    host: HostView
    # The ModelHost object (where its calls' failures are told).
    body: Mapping[str, Any]
    # The host pods it owns (only they are called: ``reconcile_host.owned_pods``).
    pods: list[Mapping[str, Any]]
    # Each owned host pod's control API base, by name.
    urls: Mapping[str, str]
    # The shared pools' objects on the host, by name (where their models' failures are told too).
    pools: Mapping[str, Mapping[str, Any]]

    def pod(self, name: str) -> Mapping[str, Any] | None:
        """The owned host pod called ``name``."""
        return next((p for p in self.pods if (p.get("metadata") or {}).get("name") == name), None)


async def apply_models(planned: HostPassPlan, models: HostModels) -> None:
    """Make a ModelHost pass's control calls on the host pods it owns and write their annotations; the
    shared pools on the host are poked when anything changed (their status lists the host pods holding
    them). A call that changed a host pod marks its cached ``/stats`` stale (``StatsScraper.invalidate``)."""
    await _make_calls(models, planned.models)
    if planned.news:
        models.book.poke_host(models.host.key)
    await write_annotations(
        models.services, models.run, models.host.namespace, planned.annotations, models.pods
    )
    models.run.retry_in = planned.models.retry_in


async def _make_calls(models: HostModels, placing: ModelCalls) -> None:
    services, run, book = models.services, models.run, models.book
    key = book.control_keys.get(models.host.key)
    if not placing.calls:
        return
    if key is None:
        why = "no control call is made: the ModelHost's control key Secret could not be made"
        if run.no_control != why:
            run.no_control = why
            services.events.post(models.body, Event("Warning", "NoControlKey", why))
        return
    run.no_control = None
    failed: list[tuple[str, Event]] = []
    for call in placing.calls:
        url = models.urls.get(call.pod)
        if url is None:
            continue
        if call.action == "load":
            slot = (call.pod, call.pool)
            run.devices[slot] = call.device
            run.loading[slot] = asyncio.create_task(_load(models, call, url=url, key=key))
            continue
        failure = await _call(models, call, url=url, key=key)
        if failure is not None:
            failed.append((call.pool, failure))
    tell_pools(services, models.pools, failed)
    book.poke(models.host.charge_key)


def tell_pools(
    services: Services, pools: Mapping[str, Mapping[str, Any]], failed: Iterable[tuple[str, Event]]
) -> None:
    """Tell each pool the failures of its model's control calls of one pass, one Warning per reason and
    pool (the host pods' messages joined, as a pass's Normal Events are: ``planner.status.coalesce``)."""
    by_pool: dict[str, list[Event]] = {}
    for pool, event in failed:
        by_pool.setdefault(pool, []).append(event)
    for pool, events in sorted(by_pool.items()):
        body = pools.get(pool)
        if body is not None:
            for event in coalesce(events, kinds=("Normal", "Warning")):
                services.events.post(body, event)


async def _call(models: HostModels, call: Control, *, url: str, key: str) -> Event | None:
    """Make one control call; a failure is told on the ModelHost and returned (None: it succeeded).  One
    that changed the host pod (or found the model gone) marks its cached ``/stats`` stale: the next pass
    refetches it at once and runs again when it comes (not a resync later, repeating the call)."""
    services, run, body = models.services, models.run, models.body
    control = services.host_control
    logger.info("host pod %s: %s %s (%s)", call.pod, call.action, call.pool, call.why)
    try:
        if call.action == "load":
            await control.load(url, key, call.pool, load_settings(call, body))
            run.loaded[(call.pod, call.pool)] = call.load or ""
            run.landed[(call.pod, call.pool)] = time.monotonic()
        elif call.action == "unload":
            try:
                await control.unload(url, key, call.pool)
            except ControlError as exc:
                if exc.status != 404:  # not there: unloaded already
                    raise
            run.loaded.pop((call.pod, call.pool), None)
            run.landed.pop((call.pod, call.pool), None)
        else:
            await control.sleep(url, key, call.pool)
    except ControlError as exc:
        services.metrics.placement_call(call.action, ok=False)
        run.backoff[(call.pod, call.pool)] = time.monotonic() + BACKOFF_S
        reason = {"load": "LoadFailed", "unload": "UnloadFailed", "sleep": "SleepFailed"}[call.action]
        message = f"{call.action} of pool {call.pool} on host pod {call.pod} failed: {exc}"
        services.events.post(body, Event("Warning", reason, message))
        return Event("Warning", reason, f"host pod {call.pod}: {call.action} failed: {exc}")
    services.metrics.placement_call(call.action, ok=True)
    run.backoff.pop((call.pod, call.pool), None)
    pod = models.pod(call.pod)
    if pod is not None:
        services.scraper.invalidate(pod)
    return None


async def _load(models: HostModels, call: Control, *, url: str, key: str) -> None:
    """One load, a task of its own: told on the ModelHost when it serves, on the pool when it failed; the
    ModelHost's daemon is poked when it ends (its next pass sees the model in the host's ``/stats``)."""
    try:
        failure = await _call(models, call, url=url, key=key)
        pool = models.pools.get(call.pool)
        if failure is None:
            models.services.events.post(
                models.body, Event("Normal", "Loaded", f"pool {call.pool} loaded on host pod {call.pod}")
            )
        elif pool is not None:
            models.services.events.post(pool, failure)
    finally:
        models.run.loading.pop((call.pod, call.pool), None)
        models.book.poke(models.host.charge_key)


def load_settings(call: Control, host: Mapping[str, Any]) -> dict[str, Any]:
    """The load's config: the pool's settings and, on a host pod of several GPUs, the device the ledger
    chose (the operator's choice, not one of the pool's settings). A host pod of one device is not told:
    one running an image from before several devices refuses a ``device`` it does not know (400), and the
    operator's upgrade does not roll the host pods."""
    settings = _settings(call.load)
    if int((host.get("spec") or {}).get("gpusPerHost") or 0) > 1:
        settings["device"] = call.device
    return settings


def _settings(load: str | None) -> dict[str, Any]:
    parsed = json.loads(load or "{}")
    return parsed if isinstance(parsed, dict) else {}


async def write_annotations(
    services: Services, run: HostRun, namespace: str, wanted: Mapping[str, str], pods: list[Mapping[str, Any]]
) -> None:
    """Write each host pod's ``modelpool.dev/models`` where it differs from what the pod carries (``pods``:
    the pods index). A value written is not written again while the index still shows the pod as it was
    before the write (the watch has not brought the write back yet); a later change of the pod that
    leaves another value there (someone edited it) is overwritten."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        name, uid, version = str(meta.get("name")), str(meta.get("uid")), meta.get("resourceVersion")
        value = wanted.get(name)
        if value is None or (meta.get("annotations") or {}).get(ANNOTATION_MODELS) == value:
            continue
        if run.annotated.get(uid) == (value, version):
            continue
        patch = {"metadata": {"annotations": {ANNOTATION_MODELS: value}}}
        failure = await attempt(
            "PatchFailed", f"host pod {name}", services.kube.patch_pod(namespace, name, patch)
        )
        if failure is None:
            run.annotated[uid] = (value, version)
        else:
            logger.warning("%s", failure.message)
    alive = {str((p.get("metadata") or {}).get("uid")) for p in pods}
    run.annotated = {uid: written for uid, written in run.annotated.items() if uid in alive}


async def unload_everywhere(
    services: Services, *, key: str, model: str, urls: Mapping[str, str]
) -> list[str]:
    """Unload ``model`` from each host pod of ``urls`` (a shared pool being deleted); returns the calls
    that a host refused (a host that does not answer is skipped: it serves nothing, and the ModelHost's
    pass unloads the model there once it answers again, its pool being gone)."""
    refused = []
    for pod, url in sorted(urls.items()):
        try:
            await services.host_control.unload(url, key, model)
        except ControlError as exc:
            if exc.status is not None and exc.status != 404:
                refused.append(f"host pod {pod}: {exc}")
    return refused


def derived_control_key(
    services: Services, namespace: str, host: str, pods: Iterable[Mapping[str, Any]]
) -> str | None:
    """A ModelHost's control key derived anew (``control_keys.derive_control_key``) from the uid its host
    pods' controller owner reference names (a restarted operator whose host daemon has not run yet); None
    without an owned host pod. No Secret is read. ``pods`` come from the ``OwnedPods`` view: that uid is
    the ModelHost's own, never one a pod made up."""
    for pod in pods:
        owner = controller_owner(pod.get("metadata") or {})
        if owner is not None and owner.kind == MODELHOST_KIND and owner.name == host:
            return derive_control_key(services.control_seed, namespace, host, owner.uid)
    return None
