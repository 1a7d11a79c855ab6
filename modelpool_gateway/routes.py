"""The gateway's own routes (Starlette): model listing, health, readiness, v2 server metadata.

``GET /v1/models`` lists every pool the caller's key grants that the gateway can route to (pools at zero
included: a request for one is held while a worker starts), each under the shortest name that resolves to
it among them; ``GET /v1/models/{model}`` resolves among them too (``modelpool_gateway.access``).
``/healthz`` answers while the process runs; ``/readyz`` and ``/v2/health/ready`` once every watch (the
key Secrets' included) has listed its objects (before that, every model would look unknown), and while no
watch is stale (failing for longer than ``watch_stale_seconds``: the API server is unreachable, so what the
gateway routes on may be out of date).  Unready takes the replica out of its Service; requests that still
arrive are routed on the state it last saw.
Unknown paths get a 404 in the protocol's own shape; ``/metrics`` among them: the metrics are served on a
port of their own (``Metrics.serve``), never to the clients.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from modelpool_gateway import __version__
from modelpool_gateway.access import Access, grant_of
from modelpool_gateway.cache import Registry
from modelpool_gateway.draining import Draining
from modelpool_gateway.errors import error_body
from modelpool_gateway.metrics import Metrics
from modelpool_gateway.names import NameIndex, Resolved
from modelpool_gateway.state import Pool
from modelpool_gateway.watch import WatchHealth, stale_watches


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def _model_entry(registry: Registry, index: NameIndex, pool: Pool) -> dict[str, Any]:
    """An OpenAI model object, plus where the model lives."""
    created = int(pool.created.timestamp()) if pool.created else 0
    return {
        "id": index.public_name(pool),
        "object": "model",
        "created": created,
        "owned_by": "modelpool",
        "modelpool": {
            "namespace": pool.namespace,
            "pool": pool.name,
            "servedModelName": pool.served_model_name,
            "task": pool.task,
            "servingWorkers": len(registry.routable(pool.key)),
        },
    }


def _pool_entries(registry: Registry, index: NameIndex, pool: Pool) -> list[dict[str, Any]]:
    """A pool's model, then each of its LoRA adapters that resolves to it, with the pool's model as its
    ``parent`` (vLLM lists adapters so)."""
    base = _model_entry(registry, index, pool)
    adapters = [
        {**base, "id": name, "root": name, "parent": base["id"]}
        for name in pool.adapters
        if index.resolve(name) == Resolved(pool.key, name)
    ]
    return [base, *adapters]


def readiness(
    watches: Collection[str], synced: Collection[str], health: WatchHealth, now: float, stale_s: float
) -> dict[str, Any]:
    """The readiness document: ready once every watch has listed and while none is stale."""
    waiting = sorted(set(watches) - set(synced))
    stale = stale_watches(health.states, now, stale_s)
    return {"ready": not waiting and not stale, "waitingFor": waiting, "stale": stale}


def build_routes(
    registry: Registry,
    metrics: Metrics,
    watches: Collection[str],
    access: Access,
    *,
    health: WatchHealth | None = None,
    stale_s: float = 30.0,
    draining: Draining | None = None,
) -> Starlette:
    """The Starlette app for every route ``Gateway`` does not proxy."""
    health = health if health is not None else WatchHealth()

    def ready() -> dict[str, Any]:
        doc = readiness(watches, registry.synced, health, time.monotonic(), stale_s)
        if draining is not None and draining.active:  # its endpoints must go before it stops
            doc = {**doc, "ready": False, "reason": "shutting down"}
        return doc

    async def list_models(request: Request) -> Response:
        grant = grant_of(request.scope)
        index = access.index(grant)
        pools = sorted((p for p in registry.pools.values() if grant.allows(p.key)), key=lambda p: p.key)
        data = [entry for p in pools for entry in _pool_entries(registry, index, p)]
        return _json({"object": "list", "data": data})

    async def get_model(request: Request) -> Response:
        model = request.path_params["model"]
        index = access.index(grant_of(request.scope))
        resolved = index.resolve(model)
        pool = registry.pool(resolved.key) if isinstance(resolved, Resolved) else None
        if pool is None:  # counted alike whether it exists or not (``Gateway._not_found``)
            metrics.of(metrics.refused, "", "not_found").inc()
            message = getattr(resolved, "message", f"model {model!r} is not served here")
            return Response(
                error_body(True, 404, "model_not_found", message), 404, media_type="application/json"
            )
        entries = _pool_entries(registry, index, pool)
        adapter = resolved.adapter if isinstance(resolved, Resolved) else None
        return _json(next((e for e in entries if e["id"] == adapter), entries[0]))

    async def healthz(request: Request) -> Response:
        return _json({"live": True})

    async def readyz(request: Request) -> Response:
        doc = ready()
        return _json(doc, 200 if doc["ready"] else 503)

    async def v2_ready(request: Request) -> Response:
        ok = ready()["ready"]
        return _json({"ready": ok}, 200 if ok else 503)

    async def server_metadata(request: Request) -> Response:
        return _json(
            {"name": "modelpool-gateway", "version": __version__, "extensions": ["binary_tensor_data"]}
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        openai = request.url.path.startswith("/v1/")
        kind = "not_found" if status == 404 else "invalid_request"
        message = (
            f"{request.method} {request.url.path}: {'no such route' if status == 404 else 'not allowed'}"
        )
        return Response(error_body(openai, status, kind, message), status, media_type="application/json")

    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", healthz, methods=["GET"]),
        Route("/v2/health/ready", v2_ready, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found})
