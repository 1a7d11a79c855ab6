"""One request to a pool at zero through ``modelpool-gateway``, timed from the request to its answer and
split at what the cluster shows on the way (``bench.gateway``'s wake row and ``make demo`` use it).

The stretches, on this machine's wall clock (the gateway, the operator, the API server and the client
share it):

* request -> demand recorded: the gateway holds the request and writes the pool's demand Lease (its
  ``spec.renewTime``, in microseconds);
* demand -> pod created: the operator sees the Lease and creates the worker pod (when a pod watch
  started before the request first saw it);
* pod created -> model loaded: the worker process starts and loads the model (its ``/v2/health/ready``
  first answers 200, polled every 50 ms);
* model loaded -> Ready: the kubelet's probes see it (the startup probe, then the readiness probe, each
  every 2 s) and the pod's Ready condition turns True, as the watch saw it;
* Ready -> answered: the operator marks the worker serving, the gateway sees it through its own watch and
  releases the held request, which the worker computes.

The request is the real ``openai`` client's ``embeddings.create`` with no retries, so a refusal shows.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai

from modelpool_contract.demand import demand_lease_name
from modelpool_contract.labels import LABEL_POOL


@dataclass
class Wake:
    """Wall-clock times (``time.time()``) of one wake; ``None`` where it was not seen."""

    sent: float
    answered: float
    demanded: float | None
    created: float | None
    loaded: float | None
    ready: float | None
    worker: str
    dimensions: int

    @property
    def seconds(self) -> float:
        return self.answered - self.sent

    def stretches(self) -> dict[str, float | None]:
        """Seconds of each stretch, in order; ``None`` where an end was not seen."""
        marks = [self.sent, self.demanded, self.created, self.loaded, self.ready, self.answered]
        names = [
            "request -> demand recorded",
            "demand -> pod created",
            "pod created -> model loaded",
            "model loaded -> Ready",
            "Ready -> answered",
        ]
        return {
            name: (end - start) if start is not None and end is not None else None
            for name, start, end in zip(names, marks, marks[1:], strict=False)
        }

    def describe(self) -> str:
        parts = [f"{k} {v:.2f}s" if v is not None else f"{k} (not seen)" for k, v in self.stretches().items()]
        return "; ".join(parts)


class WakeWatch:
    """Watches one pool's pods and its demand Lease from before the request: the first new demand (the
    gateway renews it every few seconds while it holds requests, so the value read afterwards is not the
    first), when the first pod appeared, when its worker first said it was ready (polling its
    ``/v2/health/ready``) and when the pod first turned Ready."""

    def __init__(self, kubeconfig: Path, namespace: str, pool: str) -> None:
        self._kubeconfig, self._namespace, self._pool = kubeconfig, namespace, pool
        self.demanded: float | None = None
        self.created: float | None = None
        self.loaded: float | None = None
        self.ready: float | None = None
        self._polling = False
        self.pods_before = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._listed = [threading.Event(), threading.Event()]
        self._threads = [
            threading.Thread(target=self._guarded, args=(self._pods, self._listed[0]), daemon=True),
            threading.Thread(target=self._guarded, args=(self._demand, self._listed[1]), daemon=True),
        ]

    def start(self, timeout: float = 30) -> WakeWatch:
        for thread in self._threads:
            thread.start()
        deadline = time.monotonic() + timeout
        if not all(e.wait(max(0.0, deadline - time.monotonic())) for e in self._listed):
            where = f"{self._namespace}/{self._pool}"
            raise TimeoutError(f"the watches of {where} did not list within {timeout:.0f}s")
        if self.error is not None:
            raise RuntimeError(f"watching {self._namespace}/{self._pool} failed: {self.error!r}")
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)
        if self.error is not None:
            raise RuntimeError(f"watching {self._namespace}/{self._pool} failed: {self.error!r}")

    def _guarded(self, body: Callable[[Any, threading.Event], None], listed: threading.Event) -> None:
        from kubernetes import config  # only the watcher threads need it

        try:
            body(config.new_client_from_config(config_file=str(self._kubeconfig)), listed)
        except BaseException as exc:  # reported by stop(), which the caller calls
            self.error = exc
        finally:
            listed.set()

    def _follow(self, lister: Callable[..., Any], version: str, seen: Callable[[Any], None]) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            stream = watch.Watch().stream(lister, resource_version=version, timeout_seconds=2)
            for event in stream:
                obj = event["object"]
                meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata
                version = meta["resourceVersion"] if isinstance(meta, dict) else meta.resource_version
                if event["type"] in ("ADDED", "MODIFIED"):
                    seen(obj)

    def _pods(self, api_client: Any, listed: threading.Event) -> None:
        from kubernetes import client

        api = client.CoreV1Api(api_client)
        lister = functools.partial(
            api.list_namespaced_pod, self._namespace, label_selector=f"{LABEL_POOL}={self._pool}"
        )
        listing = lister()
        self.pods_before = len(listing.items)
        listed.set()
        self._follow(lister, listing.metadata.resource_version, self._pod_seen)

    def _pod_seen(self, pod: Any) -> None:
        now = time.time()
        self.created = self.created or now
        conditions = (pod.status and pod.status.conditions) or []
        if self.ready is None and any(c.type == "Ready" and c.status == "True" for c in conditions):
            self.ready = now
        ports = [p.container_port for c in pod.spec.containers for p in c.ports or []]
        if not self._polling and pod.status and pod.status.pod_ip and ports:
            self._polling = True
            url = f"http://{pod.status.pod_ip}:{ports[0]}/v2/health/ready"
            threading.Thread(target=self._poll_loaded, args=(url,), daemon=True).start()

    def _poll_loaded(self, url: str) -> None:
        """When the worker itself first says it is ready (its model loaded), polled every 50 ms: the pod's
        Ready waits for the kubelet's probes on top of that."""
        with httpx.Client(timeout=1, trust_env=False) as client:
            while not self._stop.is_set() and self.loaded is None:
                try:
                    if client.get(url).status_code == 200:
                        self.loaded = time.time()
                except httpx.HTTPError:
                    pass  # not listening yet
                self._stop.wait(0.05)

    def _demand(self, api_client: Any, listed: threading.Event) -> None:
        from kubernetes import client

        api = client.CoordinationV1Api(api_client)
        lister = functools.partial(
            api.list_namespaced_lease, self._namespace,
            field_selector=f"metadata.name={demand_lease_name(self._pool)}",
        )  # fmt: skip
        listing = lister()
        before = {_renewed(obj) for obj in listing.items}
        listed.set()

        def seen(obj: Any) -> None:
            value = _renewed(obj)
            if self.demanded is None and value is not None and value not in before:
                self.demanded = value

        self._follow(lister, listing.metadata.resource_version, seen)


def _renewed(lease: Any) -> float | None:
    """A Lease's renewTime (the kubernetes client's model: a datetime), as a wall-clock time."""
    moment: datetime | None = lease.spec.renew_time if lease.spec else None
    return moment.timestamp() if moment else None


def wake(
    gateway_url: str,
    kubeconfig: Path,
    namespace: str,
    pool: str,
    *,
    timeout: float,
    api_key: str = "unused",
) -> Wake:
    """Send one embeddings request for ``pool`` (which has no worker) through the gateway and time it
    (``api_key``: the gateway's API key, sent as ``Authorization: Bearer``)."""
    seen = WakeWatch(kubeconfig, namespace, pool).start()
    try:
        if seen.pods_before:
            raise RuntimeError(f"pool {namespace}/{pool} has worker pods already: it is not at zero")
        client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=api_key, timeout=timeout, max_retries=0)
        sent = time.time()
        raw = client.embeddings.with_raw_response.create(model=pool, input=["A man is eating food."])
        answered = time.time()
        data = raw.parse().data
    finally:
        seen.stop()
    return Wake(
        sent=sent,
        answered=answered,
        demanded=seen.demanded,
        created=seen.created,
        loaded=seen.loaded,
        ready=seen.ready,
        worker=raw.headers.get("x-modelpool-worker", "?"),
        dimensions=len(data[0].embedding),
    )
