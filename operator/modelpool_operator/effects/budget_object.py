"""The ModelBudget the operator creates from its settings (``budget_create``, ``budget_memory``; issue 31).

The budget is the user's object: the operator creates it once, when it does not exist, and never reads,
patches, replaces nor deletes it afterwards. A create that meets one of its name (409) is the ordinary
outcome of every start but the first, so a memory changed with kubectl survives every restart and
``helm upgrade`` (the chart's values only size the budget the first time). This replaces the chart's
post-install/post-upgrade hook, which deleted and recreated the budget on every upgrade (losing its memory
and status, and opening the budget while it was gone).

* ``budget_body``: the object created (pure).
* ``create_budget_until_done``: the create, retried until it is made or found to exist (an API server
  still starting, a CRD not yet established); meanwhile a pool admits nothing under
  ``missing_budget=refuse``, which is safe.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from modelpool_contract.api import API_VERSION, MODELBUDGET_KIND
from modelpool_operator.effects.kube import KubeApi, describe_error

logger = logging.getLogger(__name__)

#: Who made the budget (a note for people and tools: nothing reads it back).
CREATED_BY = "app.kubernetes.io/created-by"
#: Retries of a failed create: the first after this long, doubling up to the cap.
RETRY_BASE_S = 1.0
RETRY_CAP_S = 30.0


def budget_body(name: str, memory: str) -> dict[str, Any]:
    """The ModelBudget ``name`` of ``memory`` (a quantity), as the operator creates it."""
    return {
        "apiVersion": API_VERSION,
        "kind": MODELBUDGET_KIND,
        "metadata": {"name": name, "labels": {CREATED_BY: "modelpool-operator"}},
        "spec": {"memory": memory},
    }


async def create_budget_until_done(
    kube: KubeApi, name: str, memory: str, *, base_s: float = RETRY_BASE_S, cap_s: float = RETRY_CAP_S
) -> bool:
    """Create the ModelBudget ``name`` unless it exists; retried (doubling delays up to ``cap_s``) until the
    API server answers either way. True when this call made it, False when it existed."""
    delay = base_s
    while True:
        try:
            made = await kube.create_budget(budget_body(name, memory))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure: the budget stays missing, so retry (never give up)
            logger.warning(
                "creating ModelBudget %s failed (%s); retrying in %.0fs", name, describe_error(exc), delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, cap_s)
            continue
        if made:
            logger.info("created ModelBudget %s with memory %s (budget_create)", name, memory)
        else:
            logger.info("ModelBudget %s exists: left as it is (budget_create only creates)", name)
        return made


__all__ = ["CREATED_BY", "budget_body", "create_budget_until_done"]
