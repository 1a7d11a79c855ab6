"""The ModelBudget's status as of now (``budget_status_wire``): derived from every indexed worker and host
pod (``reconcile.observe``), with its Valid condition and the active operator; the budget's metrics follow
it. The budget's daemon (``handlers``) writes it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from modelpool_contract.api import parse_pool_status
from modelpool_operator.bookkeeping import Bookkeeping
from modelpool_operator.budget import BUDGET_VALID, budget_status, budget_validity
from modelpool_operator.indices import BudgetsByName
from modelpool_operator.observe.observation import PodsByPool, budget_limit
from modelpool_operator.planner.status import condition
from modelpool_operator.reconcile import observe
from modelpool_operator.services import Services


def budget_status_wire(
    services: Services,
    book: Bookkeeping,
    pods_by_pool: PodsByPool,
    budgets: BudgetsByName,
    *,
    previous: Mapping[str, Any] | None = None,
    generation: int = 0,
) -> dict[str, Any]:
    """The ModelBudget status (wire form) as of now, derived from every indexed worker, with its Valid
    condition (``previous``: the status as last written, for the condition's transition time); the
    budget's metrics follow it."""
    now = datetime.now(UTC)
    workers = observe(services, book, pods_by_pool, own=None, now=now)
    ledger = book.ledger(
        workers, budget_limit(budgets, services.config.budget_name, missing=services.config.missing_budget)
    )
    services.metrics.budget_written(ledger.total, ledger.used, ledger.reserved)
    valid, reason, message = budget_validity(ledger)
    before = parse_pool_status({"conditions": (previous or {}).get("conditions") or []}).conditions
    validity = condition(
        before,
        BUDGET_VALID,
        status="True" if valid else "False",
        reason=reason,
        message=message,
        now=now,
        generation=generation,
    )
    status = budget_status(ledger, [validity], services.identity)
    # Without an identity no activeOperator key at all (a null would be patched at every write).
    return status.model_dump(
        mode="json", by_alias=True, exclude={"active_operator"} if not services.identity else None
    )
