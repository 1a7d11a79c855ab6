"""The gateway's picture of the cluster: pools and their workers, and the shared hosts' pods with the
pools placed on them, fed by the watches, read by requests.

Only the watch loops write it (one event at a time, on the event loop), and every change to a pool or to
its set of routable workers calls the subscribers with the pool's key, so held requests are released the
moment a worker becomes serving.  A relist (``replace_*``) replaces one watch's whole scope, so whatever
was deleted while a watch was down disappears too.  A shared pool's (``spec.host``) routable workers are
the host pods ``picker.shared_candidates`` names, each as a ``Worker`` of the pool; a host pod's change
calls the subscribers with every pool it held or holds.

Nothing of the gateway's own namespace (the release namespace, where the operator and the gateway run and
their Secrets live) enters it: a pool there is never routed, whatever the watches send (a cluster-wide
watch sends every namespace); the first one skipped is logged, once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime

from modelpool_gateway.names import NameIndex
from modelpool_gateway.picker import shared_candidates
from modelpool_gateway.state import HostPod, Key, Pool, Worker

log = logging.getLogger("modelpool.gateway.registry")

Listener = Callable[[Key], None]


def _in_scope(key: Key, namespace: str | None) -> bool:
    return namespace is None or key[0] == namespace


class Registry:
    """Pools by (namespace, name), workers by (namespace, pod), routable workers by pool."""

    def __init__(self, own_namespace: str | None = None) -> None:
        # The namespace whose pools, workers and host pods are never taken in (module docstring).
        self.own_namespace = own_namespace
        self._skip_logged = False
        self.pools: dict[Key, Pool] = {}
        self.workers: dict[Key, Worker] = {}
        self.index = NameIndex.build(())
        self._routable: dict[Key, dict[Key, Worker]] = {}
        self.host_pods: dict[Key, HostPod] = {}
        # The host pods that name each pool in their placement annotation, whatever the model's state there.
        self._placed: dict[Key, dict[Key, HostPod]] = {}
        self._listeners: list[Listener] = []
        # Watch scopes that have completed their first list (readiness).
        self.synced: set[str] = set()

    def _own(self, namespace: str) -> bool:
        """Whether ``namespace`` is the gateway's own (never routed); logs the first pool skipped."""
        return namespace == self.own_namespace

    def _skip_pool(self, pool: Pool) -> bool:
        if not self._own(pool.key[0]):
            return False
        if not self._skip_logged:
            self._skip_logged = True
            log.warning(
                "ModelPool %s/%s skipped: pools of the gateway's own namespace %s are never routed (it holds "
                "the operator's and the gateway's Secrets); create pools in another namespace (logged once)",
                *pool.key,
                pool.key[0],
            )
        return True

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _notify(self, pool_key: Key) -> None:
        for listener in self._listeners:
            listener(pool_key)

    # ---- reads ----

    def pool(self, key: Key) -> Pool | None:
        return self.pools.get(key)

    def routable(self, pool_key: Key) -> list[Worker]:
        """The workers requests for this pool may go to now (a shared pool's: host pods)."""
        pool = self.pools.get(pool_key)
        if pool is not None and pool.host is not None:
            placed = self._placed.get(pool_key)
            if not placed:
                return []
            return [p.upstream(pool.name) for p in shared_candidates(pool.name, pool.host, placed.values())]
        found = self._routable.get(pool_key)
        return list(found.values()) if found else []

    def has_routable(self, pool_key: Key) -> bool:
        pool = self.pools.get(pool_key)
        if pool is not None and pool.host is not None:
            return bool(self.routable(pool_key))
        return bool(self._routable.get(pool_key))

    def placed(self, pool_key: Key) -> list[tuple[str, str]]:
        """(host pod, the model's state there) for every pod of the shared pool's ModelHost that holds it."""
        pool = self.pools.get(pool_key)
        found = self._placed.get(pool_key)
        if pool is None or pool.host is None or not found:
            return []
        return sorted((p.name, p.models[pool.name]) for p in found.values() if p.host == pool.host)

    # ---- pools ----

    def set_pool(self, pool: Pool) -> None:
        if self._skip_pool(pool):
            return
        if self._put_pool(pool):
            self.index = NameIndex.build(self.pools.values())
        self._notify(pool.key)

    def _put_pool(self, pool: Pool) -> bool:
        """Store ``pool``; True when the names it answers to are new (the index must be rebuilt)."""
        old = self.pools.get(pool.key)
        if old is not None and pool.demanded_at is None and old.uid == pool.uid:
            # The watch does not carry the demand (it lives in the pool's Lease): keep what was read.
            pool = replace(pool, demanded_at=old.demanded_at)
        self.pools[pool.key] = pool
        return old is None or (old.name, old.served_model_name) != (pool.name, pool.served_model_name)

    def record_demand(self, key: Key, at: datetime) -> None:
        """The demand for the pool as the demand recorder last read or wrote it (for held requests'
        messages; nothing waits on it, so no one is notified)."""
        pool = self.pools.get(key)
        if pool is not None and pool.demanded_at != at:
            self.pools[key] = replace(pool, demanded_at=at)

    def delete_pool(self, key: Key) -> None:
        if self.pools.pop(key, None) is not None:
            self.index = NameIndex.build(self.pools.values())
            self._notify(key)

    def replace_pools(self, namespace: str | None, pools: Iterable[Pool]) -> None:
        """A fresh list of every pool in ``namespace`` (None: all namespaces); the name index is rebuilt
        once for the whole list (not once per pool: a thousand pools would cost a million entries)."""
        fresh = {p.key: p for p in pools if not self._skip_pool(p)}
        gone = [k for k in self.pools if _in_scope(k, namespace) and k not in fresh]
        for key in gone:
            del self.pools[key]
        renamed = [self._put_pool(pool) for pool in fresh.values()]
        if gone or any(renamed):
            self.index = NameIndex.build(self.pools.values())
        for key in [*gone, *fresh]:
            self._notify(key)

    # ---- workers ----

    def set_worker(self, worker: Worker) -> None:
        if self._own(worker.namespace):
            return
        old = self.workers.get(worker.key)
        self.workers[worker.key] = worker
        if old is not None and old.pool_key != worker.pool_key:
            self._drop_routable(old)
        if worker.routable:
            before = self._routable.setdefault(worker.pool_key, {}).get(worker.key)
            self._routable[worker.pool_key][worker.key] = worker
            if before != worker:
                self._notify(worker.pool_key)
        else:
            self._drop_routable(worker)

    def delete_worker(self, key: Key) -> None:
        old = self.workers.pop(key, None)
        if old is not None:
            self._drop_routable(old)

    def replace_workers(self, namespace: str | None, workers: Iterable[Worker]) -> None:
        """A fresh list of every worker pod in ``namespace`` (None: all namespaces)."""
        fresh = {w.key: w for w in workers}
        for key in [k for k in self.workers if _in_scope(k, namespace) and k not in fresh]:
            self.delete_worker(key)
        for worker in fresh.values():
            self.set_worker(worker)

    def _drop_routable(self, worker: Worker) -> None:
        found = self._routable.get(worker.pool_key)
        if found is not None and found.pop(worker.key, None) is not None:
            if not found:
                del self._routable[worker.pool_key]
            self._notify(worker.pool_key)

    # ---- shared hosts' pods ----

    def set_host_pod(self, pod: HostPod) -> None:
        if self._own(pod.namespace):
            return
        old = self.host_pods.get(pod.key)
        if old == pod:
            return
        self.host_pods[pod.key] = pod
        self._place(old, pod)

    def delete_host_pod(self, key: Key) -> None:
        old = self.host_pods.pop(key, None)
        if old is not None:
            self._place(old, None)

    def replace_host_pods(self, namespace: str | None, pods: Iterable[HostPod]) -> None:
        """A fresh list of every host pod in ``namespace`` (None: all namespaces)."""
        fresh = {p.key: p for p in pods}
        for key in [k for k in self.host_pods if _in_scope(k, namespace) and k not in fresh]:
            self.delete_host_pod(key)
        for pod in fresh.values():
            self.set_host_pod(pod)

    def _place(self, old: HostPod | None, new: HostPod | None) -> None:
        """Index the pools ``new`` holds in place of those ``old`` held, and tell every one of them."""
        pod = new or old
        assert pod is not None
        pools = {*(old.models if old else ()), *(new.models if new else ())}
        for name in sorted(pools):
            pool_key = (pod.namespace, name)
            found = self._placed.setdefault(pool_key, {})
            if new is not None and name in new.models:
                found[pod.key] = new
            else:
                found.pop(pod.key, None)
            if not found:
                del self._placed[pool_key]
            self._notify(pool_key)
