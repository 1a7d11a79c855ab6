"""The Kopf indices the passes read, as they type them (the pods index is ``observe.observation.PodsByPool``):
the pools (parsed as ``OtherPool``), the ModelBudgets and the ModelHosts (raw), and the demand the gateways
record (``modelpool_contract.demand``), each by its key."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from modelpool_contract.demand import Demand
from modelpool_operator.pool import OtherPool, PoolKey

PoolsByKey = Mapping[PoolKey, Iterable[OtherPool]]
BudgetsByName = Mapping[str, Iterable[Mapping[str, Any]]]
DemandByPool = Mapping[PoolKey, Iterable[Demand]]
#: The ModelHosts' specs (raw), by (namespace, ModelHost name).
HostsByKey = Mapping[PoolKey, Iterable[Mapping[str, Any]]]

__all__ = ["BudgetsByName", "DemandByPool", "HostsByKey", "PoolsByKey"]
