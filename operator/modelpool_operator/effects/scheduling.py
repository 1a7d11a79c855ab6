"""Pure: the scheduling fields of a worker or host pod (``affinity``, ``topologySpreadConstraints``) from
its spec, with the default soft spread over nodes when the spec sets none.

A pool's workers (a ModelHost's host pods) spread over nodes unless the spec says otherwise: one node's
drain or failure then takes as few of them as the nodes allow. The default constraint is a preference
(``ScheduleAnyway``): a pool on one node still schedules. ``topologySpreadConstraints: []`` in the spec
turns it off. The policy on what a spec may ask for (``policy``) is checked before any pod is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from modelpool_contract.api import Affinity, TopologySpreadConstraint

#: The node label the default spread counts domains by (one domain per node).
HOSTNAME_KEY = "kubernetes.io/hostname"


def default_spread(selector: Mapping[str, str]) -> dict[str, Any]:
    """The soft spread of the pods ``selector`` matches over nodes (maxSkew 1, ScheduleAnyway)."""
    return {
        "maxSkew": 1,
        "topologyKey": HOSTNAME_KEY,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": dict(selector)},
    }


def scheduling_fields(
    affinity: Affinity | None,
    constraints: Sequence[TopologySpreadConstraint] | None,
    selector: Mapping[str, str],
) -> dict[str, Any]:
    """The pod spec's ``affinity`` (when set) and ``topologySpreadConstraints``: the spec's, or the default
    spread over the pods ``selector`` matches when unset (None; an empty list: none)."""
    fields: dict[str, Any] = {}
    if affinity is not None:
        wire = affinity.wire()
        if wire:
            fields["affinity"] = wire
    if constraints is None:
        fields["topologySpreadConstraints"] = [default_spread(selector)]
    elif constraints:
        fields["topologySpreadConstraints"] = [c.wire() for c in constraints]
    return fields
