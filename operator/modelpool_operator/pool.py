"""A ModelPool as the operator works with it: parsed once, from the object Kopf hands over.

* ``PoolView``: the pool being reconciled: identity, spec, generation, last status, the template hash
  of its spec, and the demand a gateway recorded for it (its demand Lease, ``modelpool_contract.demand``,
  as the demand index shows it).  The reconciliation pass parses the body into one, and everything
  downstream (planner, pod and Service builders) takes the parsed view, never the raw body.
* ``OtherPool``: another pool, as far as budget preemption needs to know it (priority, minReplicas, the
  memory it waits for).  The pools index stores these, parsed once per watch event of that pool.
* ``template_hash``: the hash of the spec fields that shape a worker pod; a worker whose hash differs is
  outdated and is rolled over.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from modelpool_contract.api import (
    API_VERSION,
    MODELPOOL_KIND,
    ModelPoolSpec,
    ModelPoolStatus,
    parse_pool_spec,
    parse_pool_status,
)
from modelpool_contract.demand import Demand
from modelpool_contract.flags import IDLE_AFTER_S, runtime_setting
from modelpool_contract.host_control import LoadConfig
from modelpool_contract.times import parse_time
from modelpool_operator.observe.worker_state import ObservedWorker

PoolKey = tuple[str, str]  # (namespace, pool name)

# Spec fields that shape the pod; replicas/min/max/priority/autoscaling do not (changing them never rolls
# workers).
_TEMPLATE_FIELDS = ("model", "resources", "queue", "idle_timeout_seconds", "image", "pod_template", "auth")


#: The longest pool name a worker name carries whole; a longer one is cut and made unique again.
_WORKER_PREFIX_MAX = 45


def worker_name(pool_name: str, template_hash: str, index: int) -> str:
    """A deterministic worker name: ``<pool>-<hash5>-<index>`` (≤ 63 chars, so it fits a label value).

    A pool name longer than 45 characters is cut to 39 and followed by 5 hex of its own hash: two pools
    whose names begin alike still name their workers apart (they once shared every worker name, and the
    second one's creates met the first one's pods).

    Deterministic names make a create idempotent: an operator restarted in the middle of a scale-up gets
    409 AlreadyExists instead of a duplicate worker (``effects.kube.create_pod`` checks that the pod is the
    pool's own).
    """
    prefix = pool_name
    if len(pool_name) > _WORKER_PREFIX_MAX:
        digest = hashlib.sha256(pool_name.encode()).hexdigest()[:5]
        prefix = f"{pool_name[: _WORKER_PREFIX_MAX - 6].rstrip('-')}-{digest}"
    return f"{prefix.rstrip('-')}-{template_hash[:5]}-{index}"


def template_hash(spec: ModelPoolSpec) -> str:
    """A short, stable hash of the spec fields that shape a worker pod.

    Unset optional fields are left out, so that a new optional field in the API (unset in every existing
    pool) does not change the hash of every pool, which would roll every worker when the operator is
    upgraded."""
    shaping = {name: getattr(spec, name) for name in _TEMPLATE_FIELDS if getattr(spec, name) is not None}
    payload = {
        key: value.model_dump(mode="json", by_alias=True, exclude_none=True)
        if hasattr(value, "model_dump")
        else value
        for key, value in shaping.items()
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return digest[:10]


def _identity(body: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), meta


@dataclass(frozen=True)
class PoolView:
    """The pool being planned: identity, spec, generation, last status and the current template hash."""

    namespace: str
    name: str
    spec: ModelPoolSpec
    generation: int = 0
    status: ModelPoolStatus = field(default_factory=ModelPoolStatus)
    template_hash: str = ""
    # The pool object's uid: worker pods and the Service are owned by it (deletion cascades).
    uid: str | None = None
    # When the pool was created, and the demand a gateway last recorded for it (its time, the requests held
    # then; None: never / unreadable).
    created: datetime | None = None
    demand: Demand | None = None

    @property
    def demanded_at(self) -> datetime | None:
        """When a gateway last recorded demand for the pool."""
        return self.demand.at if self.demand is not None else None

    @classmethod
    def from_body(cls, body: Mapping[str, Any], demand: Demand | None = None) -> PoolView:
        """From a ModelPool object (metadata, spec, status) and the demand its Lease records (the demand
        index's); raises ``ValueError`` for an invalid spec."""
        namespace, name, meta = _identity(body)
        spec = parse_pool_spec(body.get("spec") or {})
        return cls(
            namespace=namespace,
            name=name,
            spec=spec,
            generation=int(meta.get("generation") or 0),
            status=parse_pool_status(body.get("status")),
            template_hash=template_hash(spec),
            uid=str(meta["uid"]) if meta.get("uid") else None,
            created=parse_time(meta.get("creationTimestamp")),
            demand=demand,
        )

    @property
    def key(self) -> PoolKey:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class OtherPool:
    """Another pool, as far as budget preemption needs to know it."""

    namespace: str
    name: str
    priority: int
    min_replicas: int
    workers: tuple[ObservedWorker, ...] = ()
    # Memory this pool is blocked on (its status.memory.waitingBytes): a lower-priority pool leaves
    # that much of any freed memory to it, so a preemption is not undone by the victim's own pool.
    waiting_memory: int = 0
    # A shared pool's ModelHost (None: dedicated workers) and its declared size.
    host: str | None = None
    declared: int = 0
    # A shared pool's replicas (hosts that hold its model), its model's load settings on a host
    # (``host_load_settings`` as JSON; None for a dedicated pool) and whether it is being deleted.
    replicas: int = 0
    load: str | None = None
    deleting: bool = False
    # A shared pool's count as its own pass last recorded it (``status.targetReplicas``, while recorded for
    # this ``spec.replicas``; None: not recorded), and its uid (the ModelHost's pass posts Events on it).
    target: int | None = None
    uid: str | None = None

    @property
    def key(self) -> PoolKey:
        return (self.namespace, self.name)

    def reference(self) -> dict[str, Any]:
        """The pool as an Event's involved object (what an ``EventSink`` posts on)."""
        meta = {"name": self.name, "namespace": self.namespace, "uid": self.uid}
        return {"apiVersion": API_VERSION, "kind": MODELPOOL_KIND, "metadata": meta}

    @classmethod
    def from_body(cls, body: Mapping[str, Any], workers: Sequence[ObservedWorker] = ()) -> OtherPool | None:
        """From a ModelPool object (metadata, spec, status); None when its spec does not parse."""
        namespace, name, _ = _identity(body)
        try:
            spec = parse_pool_spec(body.get("spec") or {})
        except ValueError:
            return None
        status = parse_pool_status(body.get("status"))
        return cls(
            namespace=namespace,
            name=name,
            priority=spec.priority,
            min_replicas=spec.min_replicas,
            workers=tuple(workers),
            waiting_memory=status.memory.waiting_bytes,
            host=spec.host,
            declared=spec.resources.memory_bytes,
            replicas=spec.replicas,
            load=json.dumps(host_load_settings(spec), sort_keys=True) if spec.host else None,
            deleting=bool((body.get("metadata") or {}).get("deletionTimestamp")),
            target=status.target_replicas if status.spec_replicas == spec.replicas else None,
            uid=str((body.get("metadata") or {}).get("uid") or "") or None,
        )


def host_load_settings(spec: ModelPoolSpec) -> dict[str, Any]:
    """A shared pool's model as a host loads it (``modelpool_contract.host_control.LoadConfig``, as JSON
    fields): its source, task, dtype, batching, its queue (capacity and request timeout), its Idle
    threshold (after which a host that sleeps idle models parks it) and its declared memory. The device is
    the operator's choice (``device``, added per call); the other limits are the host's."""
    source = spec.model.source
    if spec.model.revision and source.startswith("hf://"):
        source = source.split("@", 1)[0] + "@" + spec.model.revision
    config = LoadConfig(
        source=source,
        task=spec.model.task,
        dtype=spec.model.dtype,
        max_batch_size=spec.queue.max_batch_size,
        max_batch_delay_ms=spec.queue.max_batch_delay_ms,
        idle_after=spec.idle_timeout_seconds or IDLE_AFTER_S,
        # The pool's own queue on the host (its door and its deadline), as a dedicated worker has them.
        queue_capacity=spec.queue.capacity,
        request_timeout=spec.queue.request_timeout_seconds,
        memory=spec.resources.memory_bytes,
        trust_remote_code=True if spec.model.trust_remote_code else None,
        runtime=runtime_setting(spec.model.runtime),
    )
    return config.model_dump(exclude_none=True)
