"""``modelpool-gateway``: connect to the API server, start the watches, serve HTTP until SIGTERM.

Exit codes: 0 after a clean shutdown, 1 when the API server's configuration cannot be loaded, 2 for an
invalid flag or environment variable.  On SIGTERM held requests are answered 503 at once (their clients
may retry through another replica) and requests in flight get ``shutdown_grace_seconds`` to finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import uvicorn
from kubernetes_asyncio import client, config

from modelpool_contract import logs, tracing
from modelpool_contract.gateway_keys import default_keys_namespace
from modelpool_gateway import access_log
from modelpool_gateway.access_log import access_middleware
from modelpool_gateway.assembly import assemble
from modelpool_gateway.cache import Registry
from modelpool_gateway.config import ConfigError, GatewaySettings, load_settings
from modelpool_gateway.connections import gateway_protocol
from modelpool_gateway.demand import LeaseClient
from modelpool_gateway.draining import CloseWhenDraining, Draining
from modelpool_gateway.hold import Holds
from modelpool_gateway.keys import KeyStore, key_namespaces, key_watch
from modelpool_gateway.watch import (
    WatchHealth,
    WatchSpec,
    host_pod_watch,
    pod_watch,
    pool_watch,
    run_watch,
)

log = logging.getLogger("modelpool.gateway")

EXIT_KUBE = 1
EXIT_CONFIG = 2
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
SERVICE_ACCOUNT_NAMESPACE = SERVICE_ACCOUNT_TOKEN.with_name("namespace")


def own_namespace(settings: GatewaySettings, in_cluster: bool) -> str | None:
    """The namespace the gateway runs in: --own-namespace, else the pod's (its service account's)."""
    if settings.own_namespace is None and in_cluster and SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    return settings.own_namespace


def key_store(settings: GatewaySettings, own: str | None) -> tuple[KeyStore | None, list[str]] | str:
    """The key store and the namespaces to read key Secrets from (none with --auth none); or an error."""
    if settings.auth == "none":
        log.warning("--auth none: no API key is checked, every caller reaches every pool")
        return None, []
    admin = settings.keys_namespace or (default_keys_namespace(own) if own else None)
    # Tenant keys are read where pools are routed: never in the gateway's own namespace.
    routed = [ns for ns in settings.namespaces if ns != own]
    scopes = key_namespaces(admin, settings.tenant_keys, routed)
    return scopes if isinstance(scopes, str) else (KeyStore(scopes[0]), scopes)


async def kube_client(settings: GatewaySettings, in_cluster: bool) -> client.ApiClient:
    """An API client: the given kubeconfig, else the pod's service account, else $KUBECONFIG."""
    if settings.kubeconfig is not None:
        await config.load_kube_config(config_file=str(settings.kubeconfig))
    elif in_cluster:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config()
    return client.ApiClient()


class _Server(uvicorn.Server):
    """uvicorn, answering held requests before it waits for the ones in flight, and exiting 0 on SIGTERM
    (uvicorn itself re-raises the signal after its shutdown, which ends the process with -15)."""

    def __init__(self, cfg: uvicorn.Config, holds: Holds, draining: Draining) -> None:
        super().__init__(cfg)
        self._holds = holds
        self._draining = draining

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:  # a second Ctrl-C: stop now
            self.force_exit = True
        if self._draining.begin():  # keep serving through the delay (``draining``), then shut down
            log.info("%s: not ready; shutting down in %g s", signal.Signals(sig).name, self._draining.delay_s)
            return
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        # uvicorn's main loop ticks every 0.1 s: the delay ends on the first tick past it.
        if self._draining.over(time.monotonic()):
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._holds.abandon()
        await super().shutdown(sockets)


def replica_identity() -> str:
    """This replica, as the demand Lease's holderIdentity: the host name (in a pod, the pod's name) and the
    process id (several gateways on one host, as in the tests)."""
    return f"{socket.gethostname()}_{os.getpid()}"


def watch_scopes(namespaces: list[str], own: str | None) -> list[str | None]:
    """The namespaces to watch (None: every namespace, the registry skipping ``own``).  The gateway's own
    namespace is never routed, so a list naming only it leaves nothing to watch: the gateway then routes
    no pool (a warning says why) rather than failing, so that a release scoped to its own namespace alone
    still installs."""
    if not namespaces:
        return [None]
    if own in namespaces:
        log.warning(
            "--namespace %s skipped: pools of the gateway's own namespace are never routed%s",
            own,
            "" if set(namespaces) - {own} else "; no other namespace is named, so no pool is routed",
        )
    scopes: list[str | None] = [ns for ns in dict.fromkeys(namespaces) if ns != own]
    return scopes


def _watches(scopes: list[str | None], registry: Registry, api: client.ApiClient) -> list[WatchSpec]:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    specs: list[WatchSpec] = []
    for namespace in scopes:
        specs += [
            pool_watch(registry, custom, namespace),
            pod_watch(registry, core, namespace),
            host_pod_watch(registry, core, namespace),
        ]
    return specs


async def serve(settings: GatewaySettings, in_cluster: bool = False) -> int:
    """Run the gateway until SIGTERM/SIGINT; the exit code."""
    own = own_namespace(settings, in_cluster)
    keys = key_store(settings, own)
    scopes = watch_scopes(settings.namespaces, own)
    if isinstance(keys, str):
        log.error("%s", keys)
        return EXIT_CONFIG
    store, key_scopes = keys
    try:
        api = await kube_client(settings, in_cluster)
    except Exception as exc:
        log.error("cannot load the API server's configuration: %s", exc)
        return EXIT_KUBE
    registry = Registry(own)
    specs = _watches(scopes, registry, api)
    specs += [key_watch(store, client.CoreV1Api(api), ns) for ns in key_scopes if store is not None]
    health = WatchHealth()
    draining = Draining(settings.shutdown_delay_seconds)
    parts = assemble(
        settings,
        registry=registry,
        leases=LeaseClient(client.CoordinationV1Api(api)),
        holder=replica_identity(),
        keys=store,
        watches=[s.name for s in specs],
        health=health,
        draining=draining,
    )
    tasks = [
        asyncio.create_task(
            run_watch(
                spec,
                registry,
                parts.metrics,
                settings.watch_timeout_seconds,
                settings.watch_backoff_max_seconds,
                health=health,
            )
        )
        for spec in specs
    ]
    server = _Server(
        uvicorn.Config(
            # The request ids and our access line (``access_log``) replace uvicorn's access log.
            access_middleware(CloseWhenDraining(parts.app, draining), lines=settings.access_log),
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            log_config=None,  # uvicorn's own lines go through the root logger's format (``logs``)
            access_log=False,
            proxy_headers=False,
            # The worker's own Date and Server headers pass through.
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) or None,
            timeout_keep_alive=settings.client_keepalive_seconds,
            lifespan="off",
            # 431 for a header block over its bound, 408 for headers too slow, 503 for a connection past the
            # cap (uvicorn has none of these: modelpool_gateway.connections).
            http=gateway_protocol(settings.header_timeout_seconds, settings.max_connections),
        ),
        parts.holds,
        draining,
    )
    if settings.metrics_port:
        parts.metrics.serve(settings.host, settings.metrics_port)
    log.info(
        "modelpool-gateway listening on %s:%d (metrics on %s), watching %s (never routing %s); API keys %s",
        settings.host,
        settings.port,
        settings.metrics_port or "no port",
        ", ".join(s or "every namespace" for s in scopes) or "no namespace",
        own or "none: no own namespace",
        f"from Secrets in {', '.join(key_scopes)}" if store is not None else "not checked (--auth none)",
    )
    if tracing.setup("modelpool-gateway", settings.otlp_endpoint, settings.trace_sample_ratio):
        log.info(
            "traces to %s (sampling %g of the requests without a traceparent)",
            tracing.traces_url(settings.otlp_endpoint or ""),
            settings.trace_sample_ratio,
        )
    try:
        await server.serve()
    finally:
        access_log.flush()  # the access lines still pending
        tracing.shutdown()  # what the exporter still holds is sent (bounded by its timeout)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await parts.demand.close()
        parts.upstream.close()
        parts.metrics.close()
        await api.close()
    return 0


def _loop_factory() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # uvicorn[standard] brings it; plain asyncio works too
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def main(argv: Sequence[str] | None = None) -> None:
    try:
        settings = load_settings(argv)
    except ConfigError as exc:
        print(f"modelpool-gateway: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    logs.set_up(settings.log_format, settings.log_level, "gateway")
    with asyncio.Runner(loop_factory=_loop_factory) as runner:
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and SERVICE_ACCOUNT_TOKEN.exists()
        code = runner.run(serve(settings, in_cluster))
    sys.exit(code)


if __name__ == "__main__":
    main()
