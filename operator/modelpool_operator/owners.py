"""Our controller owner reference on a pod (``Owner``, ``controller_owner``): who made it, by kind, name and
uid. Read by the ledger (``observe.ownership``: only owned pods count) and by the control-key derivation
(``effects.host_models``): one reading of the reference for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelpool_contract.api import MODELHOST_KIND, MODELPOOL_KIND
from modelpool_contract.labels import GROUP
from modelpool_operator.host import host_pool_label


@dataclass(frozen=True, slots=True)
class Owner:
    """A pod's controller owner reference to one of our kinds."""

    kind: str
    name: str
    uid: str


def controller_owner(meta: Mapping[str, Any]) -> Owner | None:
    """The pod's controller owner reference when it is a ``modelpool.dev`` ModelPool or ModelHost with a
    name and a uid; None otherwise (no owner, another controller, another group, a partial reference)."""
    for ref in meta.get("ownerReferences") or ():
        if not isinstance(ref, Mapping) or ref.get("controller") is not True:
            continue
        group = str(ref.get("apiVersion") or "").partition("/")[0]
        kind, name, uid = ref.get("kind"), ref.get("name"), ref.get("uid")
        if group != GROUP or kind not in (MODELPOOL_KIND, MODELHOST_KIND) or not name or not uid:
            return None
        return Owner(kind=str(kind), name=str(name), uid=str(uid))
    return None


def owner_pool_label(owner: Owner) -> str:
    """The ``modelpool.dev/pool`` value the pods of ``owner`` carry (``host.host_pool_label`` for a host)."""
    return host_pool_label(owner.name) if owner.kind == MODELHOST_KIND else owner.name
