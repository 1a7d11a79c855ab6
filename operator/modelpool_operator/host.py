"""``HostView``: the ModelHost being reconciled, parsed once a pass (identity, spec, uid), and the key its
host pods are charged under in the ModelBudget's ledger.

Host pods carry the worker pods' label ``modelpool.dev/pool`` with the value ``host_<ModelHost name>``
(``host_pool_label``): the operator watches only pods with that label (a server-side filter), and the
budget's ledger then charges them as it charges workers, under that key. The ``_`` is in no object name,
so no ModelPool is ever called that; the label ``modelpool.dev/host=<name>`` says which ModelHost they
belong to (``modelpool_contract.placements.LABEL_HOST``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelpool_contract.api import HOST_POOL_PREFIX, ModelHostSpec, parse_host_spec
from modelpool_operator.pool import PoolKey


def host_pool_label(name: str) -> str:
    """The ``modelpool.dev/pool`` value of the ModelHost ``name``'s pods (a label value: at most 63
    characters, so a ModelHost's name has at most ``MODELHOST_NAME_MAX_LENGTH``, 58: the CRD refuses a
    longer one)."""
    return f"{HOST_POOL_PREFIX}{name}"


def host_charge_key(namespace: str, name: str) -> PoolKey:
    """The key a ModelHost's pods are indexed, charged and reserved under (as a pool's workers are)."""
    return (namespace, host_pool_label(name))


def host_template_hash(spec: ModelHostSpec) -> str:
    """A short, stable hash of what shapes a host pod: the spec but ``replicas`` and ``disruption`` (the
    PodDisruptionBudget's, not the pod's; unset fields left out, so a new optional field does not roll every
    host pod on an upgrade). A host pod of another hash is replaced."""
    shaping = spec.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude={"replicas", "disruption"}
    )
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:10]


def host_pod_name(host: HostView, index: int) -> str:
    """The ``index``-th host pod of the ModelHost: ``<host>-<index>`` (the same name is re-made when gone)."""
    return f"{host.name}-{index}"


@dataclass(frozen=True)
class HostView:
    """A ModelHost: its identity, parsed spec and uid (its pods and Secret are owned by it)."""

    namespace: str
    name: str
    spec: ModelHostSpec
    uid: str | None = None
    generation: int = 0
    # The hash its pods are labelled with: the spec's (``host_template_hash``) unless given; the pass
    # replaces it with the rendered pod's (``effects.resources.host_pod_template_hash``: the operator's
    # settings too).
    template_hash: str = ""

    def __post_init__(self) -> None:
        if not self.template_hash:
            object.__setattr__(self, "template_hash", host_template_hash(self.spec))

    @property
    def key(self) -> PoolKey:
        return (self.namespace, self.name)

    @property
    def charge_key(self) -> PoolKey:
        return host_charge_key(self.namespace, self.name)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> HostView:
        """From a ModelHost object; raises ``ValueError`` (pydantic's) for an invalid spec."""
        meta = body.get("metadata") or {}
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            spec=parse_host_spec(dict(body.get("spec") or {})),
            uid=str(meta["uid"]) if meta.get("uid") else None,
            generation=int(meta.get("generation") or 0),
        )
