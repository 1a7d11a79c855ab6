"""Whether an object the operator owns still says what the operator wrote: pure, for the owned objects'
watch (``owned``) and the memory of each pool's run (``bookkeeping``).

What the operator writes on a Service, NetworkPolicy, PodDisruptionBudget or InferencePool is its labels
and its spec (``effects.kube``'s ``_ensure_owned`` brings exactly those up to date). The API server adds
to both (a Service's clusterIP and each port's protocol, a policy's policyTypes, a CRD's defaults) and
others may add labels: neither is an edit. An edit is a field the operator wrote that now reads otherwise
or is gone: ``drifted`` compares what was written as a subset of what is live (a list item by item).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Written once, never brought up to date (immutable): ``effects.kube.ensure_service`` leaves it out.
_UNMANAGED_SPEC = frozenset({"clusterIP"})


def managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``obj`` the operator writes: its labels and its spec (but what is immutable)."""
    spec = obj.get("spec") or {}
    return {
        "labels": dict((obj.get("metadata") or {}).get("labels") or {}),
        "spec": {k: v for k, v in spec.items() if k not in _UNMANAGED_SPEC},
    }


def fields_digest(obj: Mapping[str, Any]) -> int:
    """A digest of ``managed_fields``: equal while none of them changes (a status write keeps it)."""
    return hash(json.dumps(managed_fields(obj), sort_keys=True, default=str))


def drifted(written: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether ``live`` no longer says what ``written`` did: a written field that differs or is gone."""
    return not _within(managed_fields(written), managed_fields(live))


def _within(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, Mapping):
        return isinstance(theirs, Mapping) and all(
            k in theirs and _within(v, theirs[k]) for k, v in ours.items()
        )
    if isinstance(ours, list):
        return isinstance(theirs, list) and len(ours) == len(theirs) and all(map(_within, ours, theirs))
    return bool(ours == theirs)
