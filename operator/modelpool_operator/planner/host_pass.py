"""A ModelHost's pass, decided whole (pure) over one observation (``HostObservation``, made once a pass by
``reconcile_host.observe_host``): its host pods (``planner.hosts.plan_host``: which to create and delete
within the budget, its status) and the shared pools' models on them (``planner.host_models.plan_models``:
the control calls, and each host pod's ``modelpool.dev/models`` annotation). The effects apply both
(``effects.hosts``, ``effects.host_models``) and decide nothing.

Models are placed only on the host pods the ModelHost owns by uid (only those are sent its control key),
whose ``/stats`` is known, and which this pass does not delete (a host pod beyond ``replicas``, or rolled:
a model loaded there would go with it). No control call is made while a host pod's ``/stats`` is being
refetched after an earlier call (``refetching``): the observation predates that call, and would repeat it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from modelpool_operator.budget import Ledger
from modelpool_operator.host import HostView
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.placement.ledger import Host
from modelpool_operator.planner.host_models import (
    ModelCalls,
    SharedPool,
    Slot,
    models_annotations,
    plan_models,
)
from modelpool_operator.planner.hosts import HostPlan, plan_host


@dataclass(frozen=True)
class HostObservation:
    """Everything one ModelHost pass decides over, read once at its start."""

    host: HostView
    # Every host pod the index lists (charged as workers are) and the ledger's view of each (its models
    # from its ``/stats``, by pod name); the budget's ledger, counting them and the reservations.
    pods: Sequence[ObservedWorker]
    hosts: Sequence[Host]
    ledger: Ledger
    # The shared pools on the ModelHost, each with the count its own pass decided.
    pools: Sequence[SharedPool] = ()
    # The host pods the ModelHost owns by uid (the only ones called), and those whose ``/stats`` is known.
    owned: frozenset[str] = frozenset()
    known: frozenset[str] = frozenset()
    # Each owned host pod's ``modelpool.dev/models`` as the index shows it (None: none).
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    # (source, task) each owned host pod reports of each model it holds.
    reported: Mapping[Slot, tuple[str, str]] = field(default_factory=dict)
    # This process's calls: loads in flight (or ended, not listed yet), each one's device, the settings
    # each model was loaded with, and the (host pod, pool)s whose last call failed lately.
    loading: frozenset[Slot] = frozenset()
    devices: Mapping[Slot, int] = field(default_factory=dict)
    loaded: Mapping[Slot, str] = field(default_factory=dict)
    backoff: frozenset[Slot] = frozenset()
    now: float | None = None  # Unix seconds (None: no clock: every idle model may sleep)
    # Host pod names a drain's eviction still holds in the ModelHost's budget: not made again yet.
    held: frozenset[str] = frozenset()
    refetching: bool = False  # an owned host pod's ``/stats`` predates a call made on it


@dataclass(frozen=True)
class HostPassPlan:
    """A ModelHost pass: its host pods (``pods``), the control calls on them (``models``), the annotation
    each host pod whose ``/stats`` is known should carry, and whether its shared pools look again (an
    annotation changes, or a call is made: their status lists the host pods holding them)."""

    pods: HostPlan
    models: ModelCalls
    annotations: Mapping[str, str]
    news: bool = False


def stale_models(pools: Sequence[SharedPool], reported: Mapping[Slot, tuple[str, str]]) -> set[Slot]:
    """The models whose host reports another source or task than their pool's settings (loaded by an
    earlier process, or by hand)."""
    wanted = {p.name: json.loads(p.load) for p in pools}
    return {
        (pod, model)
        for (pod, model), said in reported.items()
        if model in wanted and (wanted[model].get("source"), wanted[model].get("task")) != said
    }


def plan_host_pass(observed: HostObservation) -> HostPassPlan:
    """The whole pass of a ModelHost over ``observed`` (see the module doc)."""
    host = observed.host
    pods = plan_host(host, observed.pods, observed.hosts, observed.ledger, held=observed.held)
    doomed = set(pods.delete)
    views = [
        replace(h, accepting=False) if h.name in doomed else h
        for h in observed.hosts
        if h.name in observed.owned
    ]
    models = plan_models(
        host.namespace,
        views,
        observed.pools,
        loading=observed.loading,
        loaded=observed.loaded,
        stale=stale_models(observed.pools, observed.reported),
        backoff=observed.backoff,
        now=observed.now,
        devices=observed.devices,
    )
    if models.calls and observed.refetching:
        models = replace(models, calls=())
    annotations = models_annotations(v for v in views if v.name in observed.known)
    changed = any(observed.annotations.get(pod) != value for pod, value in annotations.items())
    return HostPassPlan(pods, models, annotations, news=changed or bool(models.calls))
