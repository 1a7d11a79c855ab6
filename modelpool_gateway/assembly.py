"""The gateway's parts wired into one ASGI app: ``assemble``, the one definition of the graph that
``main.serve`` runs and that the benchmarks and the in-process tests build (each had its own copy).

What comes from outside is what differs between them: the pools and workers (``registry``: watched by the
gateway, set by hand in a benchmark), where the demand Leases are written (``leases``), the API keys
(``keys``: None with ``--auth none``), and the watches' health for ``/readyz``.  Everything else is the
same objects, connected the same way: a change of a pool's workers updates its serving-workers gauge and
releases (or, for a pool gone, abandons) the requests held for it, and its fair queue's slots
(``fairness``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from modelpool_gateway.access import Access
from modelpool_gateway.app import Gateway, fair_queues
from modelpool_gateway.cache import Registry
from modelpool_gateway.config import GatewaySettings
from modelpool_gateway.demand import DemandRecorder, LeaseClient
from modelpool_gateway.draining import Draining
from modelpool_gateway.hold import Holds
from modelpool_gateway.keys import KeyStore
from modelpool_gateway.limits import Limiter
from modelpool_gateway.metrics import Metrics
from modelpool_gateway.proxy import Upstream
from modelpool_gateway.routes import build_routes
from modelpool_gateway.state import Key
from modelpool_gateway.watch import WatchHealth


@dataclass(frozen=True)
class Assembly:
    """The app and the parts its owner drives or closes (the demand writer, the upstream connections)."""

    app: Gateway
    registry: Registry
    metrics: Metrics
    holds: Holds
    demand: DemandRecorder
    upstream: Upstream
    access: Access
    limiter: Limiter


def assemble(
    settings: GatewaySettings,
    *,
    registry: Registry,
    leases: LeaseClient,
    holder: str,
    keys: KeyStore | None = None,
    watches: Collection[str] = (),
    health: WatchHealth | None = None,
    draining: Draining | None = None,
) -> Assembly:
    """The gateway over ``registry``; ``holder`` names this replica on the demand Leases, ``watches`` the
    watches ``/readyz`` reports."""
    metrics = Metrics()
    holds = Holds(settings.max_held_per_pool, registry.has_routable)
    fair = fair_queues(settings, registry)
    demand = DemandRecorder(
        leases,
        pools=registry.pool,
        held=holds.held,
        metrics=metrics,
        interval_s=settings.demand_interval_seconds,
        holder=holder,
        seen=registry.record_demand,
    )

    def changed(key: Key) -> None:
        metrics.serving_workers.labels(f"{key[0]}/{key[1]}").set(len(registry.routable(key)))
        if registry.pool(key) is None:
            holds.abandon(key)
            demand.forget(key)
        else:
            holds.changed(key)
        fair.changed(key)  # more workers: more slots; none (or gone): its waiters are routed again

    registry.subscribe(changed)
    access = Access(settings.auth, keys, registry)
    limiter = Limiter(settings.replicas)
    if keys is not None:  # a key's windows go with its last Secret
        keys.on_gone = limiter.forget
    upstream = Upstream(settings)
    routes = build_routes(
        registry,
        metrics,
        watches,
        access,
        health=health,
        stale_s=settings.watch_stale_seconds,
        draining=draining,
    )
    app = Gateway(
        settings=settings,
        registry=registry,
        holds=holds,
        demand=demand,
        upstream=upstream,
        metrics=metrics,
        access=access,
        limiter=limiter,
        fair=fair,
        fallback=routes,
    )
    return Assembly(app, registry, metrics, holds, demand, upstream, access, limiter)
