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

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from modelpool_contract.demand import demand_lease_name
from modelpool_contract.labels import LABEL_POOL
from modelpool_contract.times import parse_time
from testkit.watch import ListWatch


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
    """Watches one pool's pods and its demand Lease from before the request (two ``testkit.watch``
    watches): the first new demand (the gateway renews it every few seconds while it holds requests, so
    the value read afterwards is not the first), when the first pod appeared, when its worker first said
    it was ready (polling its ``/v2/health/ready``) and when the pod first turned Ready."""

    def __init__(self, kubeconfig: Path, namespace: str, pool: str) -> None:
        self._namespace, self._pool = namespace, pool
        self.demanded: float | None = None
        self.created: float | None = None
        self.loaded: float | None = None
        self.ready: float | None = None
        self._polling = False
        self.pods_before = 0
        self._demand_before: set[float | None] = set()
        self._stop = threading.Event()
        self._watches = [
            ListWatch(
                kubeconfig, "CoreV1Api", "list_namespaced_pod", namespace,
                label_selector=f"{LABEL_POOL}={pool}",
                on_list=self._pods_listed, on_event=self._pod_event, name="wake-pods",
            ),
            ListWatch(
                kubeconfig, "CoordinationV1Api", "list_namespaced_lease", namespace,
                field_selector=f"metadata.name={demand_lease_name(pool)}",
                on_list=self._leases_listed, on_event=self._lease_event, name="wake-demand",
            ),
        ]  # fmt: skip

    @property
    def error(self) -> BaseException | None:
        return next((w.error for w in self._watches if w.error is not None), None)

    def start(self, timeout: float = 30) -> WakeWatch:
        for w in self._watches:
            w.start()
        deadline = time.monotonic() + timeout
        if not all(w.listed.wait(max(0.0, deadline - time.monotonic())) for w in self._watches):
            where = f"{self._namespace}/{self._pool}"
            raise TimeoutError(f"the watches of {where} did not list within {timeout:.0f}s")
        if self.error is not None:
            raise RuntimeError(f"watching {self._namespace}/{self._pool} failed: {self.error!r}")
        return self

    def stop(self) -> None:
        self._stop.set()
        for w in self._watches:
            w.stop()
        if self.error is not None:
            raise RuntimeError(f"watching {self._namespace}/{self._pool} failed: {self.error!r}")

    def _pods_listed(self, pods: list[dict[str, Any]]) -> None:
        self.pods_before = len(pods)

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind not in ("ADDED", "MODIFIED"):
            return
        now = time.time()
        self.created = self.created or now
        status = pod.get("status") or {}
        conditions = status.get("conditions") or []
        if self.ready is None and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
        ):
            self.ready = now
        ports = [p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or []]
        if not self._polling and status.get("podIP") and ports:
            self._polling = True
            url = f"http://{status['podIP']}:{ports[0]}/v2/health/ready"
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

    def _leases_listed(self, leases: list[dict[str, Any]]) -> None:
        self._demand_before = {_renewed(lease) for lease in leases}

    def _lease_event(self, kind: str, lease: dict[str, Any]) -> None:
        value = _renewed(lease)
        new = value is not None and value not in self._demand_before
        if kind in ("ADDED", "MODIFIED") and self.demanded is None and new:
            self.demanded = value


def _renewed(lease: dict[str, Any]) -> float | None:
    """A Lease's renewTime, as a wall-clock time."""
    moment = parse_time((lease.get("spec") or {}).get("renewTime"))
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
