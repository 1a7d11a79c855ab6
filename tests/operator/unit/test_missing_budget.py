"""Issue 31 item 2: with no ModelBudget the behaviour is explicit (``missing_budget``), and the budget the
operator creates from its settings (``budget_create``) is created once and never touched again.

The decision (``observe.observation.budget_limit`` / ``budget.missing_budget_limit``) and its effect on a
pool's plan and a ModelHost's plan are pure; the create is driven against a fake API that answers as the
API server does (201, 409, errors)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from modelpool_contract.api import parse_host_spec
from modelpool_contract.settings import ConfigError
from modelpool_operator.budget import (
    BUDGET_INVALID,
    BUDGET_MISSING,
    BudgetLimit,
    admits,
    build_ledger,
    missing_budget_limit,
)
from modelpool_operator.effects.budget_object import budget_body, create_budget_until_done
from modelpool_operator.effects.kube import ApiException
from modelpool_operator.main import build_parser, config_from_args
from modelpool_operator.observe.observation import budget_limit
from modelpool_operator.placement.charge import host_charge, hosts_admitted
from modelpool_operator.planner import plan
from modelpool_operator.settings import OperatorConfig
from tests.operator.unit.op_planner import cond, ledger_for, make_spec, view, w
from tests.operator.unit.op_pods import GI, at

NOW = at(1000)


def missing_ledger(name: str = "gpus", *workers: Any) -> Any:
    limit = missing_budget_limit(name, "refuse")
    return build_ledger(limit.total, list(workers), invalid=limit.invalid, closed_reason=limit.reason)


# ---- the decision ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budgets", "missing", "expected_total", "expected_reason"),
    [
        ({"gpus": [{"memory": "8Gi"}]}, "refuse", 8 * GI, None),  # exists: its size, whatever the setting
        ({"gpus": [{"memory": "8Gi"}]}, "admit", 8 * GI, None),
        ({"gpus": [{"memory": "1e41"}]}, "admit", None, BUDGET_INVALID),  # invalid: closed, either way
        ({}, "admit", None, None),  # missing, admit chosen: no limit
        ({"other": [{"memory": "8Gi"}]}, "refuse", None, BUDGET_MISSING),  # another budget is not ours
        ({}, "refuse", None, BUDGET_MISSING),
    ],
)
def test_budget_limit_decision_table(
    budgets: dict[str, list[dict[str, str]]],
    missing: Any,
    expected_total: int | None,
    expected_reason: str | None,
) -> None:
    limit = budget_limit(budgets, "gpus", missing=missing)
    assert limit.total == expected_total
    if expected_reason is None:
        assert limit.invalid is None
    else:
        assert limit.invalid is not None and limit.reason == expected_reason


def test_a_missing_budget_under_refuse_names_the_budget_and_the_way_out() -> None:
    limit = missing_budget_limit("gpus", "refuse")
    assert limit.invalid is not None
    assert limit.invalid.startswith("ModelBudget gpus does not exist")
    assert "missing_budget" in limit.invalid and "budget.create" in limit.invalid
    assert missing_budget_limit("gpus", "admit") == BudgetLimit()


def test_a_missing_budget_under_refuse_admits_nothing_not_even_a_host_pod() -> None:
    ledger = missing_ledger()
    assert not admits(ledger, 1) and ledger.free == 0
    gpu = parse_host_spec({"gpusPerHost": 1, "deviceMemory": "80Gi"})
    assert hosts_admitted(ledger, host_charge(gpu), wanted=3) == 0


# ---- a pool's plan ----------------------------------------------------------------------------------------


def test_a_pool_waits_with_budget_missing_told_once_then_is_admitted_when_the_budget_appears() -> None:
    spec = make_spec(replicas=2, minReplicas=0)
    out = plan(view(spec), [], missing_ledger(), now=NOW)
    assert not out.create and not out.evict
    budget = next(c for c in out.status.conditions if c.type == "BudgetExceeded")
    assert (budget.status, budget.reason) == ("True", BUDGET_MISSING)
    assert budget.message.startswith("ModelBudget gpus does not exist")
    assert budget.message.endswith("no worker is admitted until it is fixed")
    assert [(e.type, e.reason) for e in out.events if "Budget" in e.reason] == [("Warning", BUDGET_MISSING)]
    again = plan(view(spec, out.status), [], missing_ledger(), now=at(1001))
    assert not again.create
    assert not [e for e in again.events if "Budget" in e.reason]  # told once
    # The budget created (by kubectl, or the operator's budget_create): admitted at the next pass.
    made = plan(view(spec, again.status), [], ledger_for(100 * GI), now=at(1002))
    assert len(made.create) == 2 and cond(made, "BudgetExceeded") == ("False", "WithinBudget")


def test_missing_after_invalid_is_told_anew_with_its_own_reason() -> None:
    spec = make_spec(replicas=1, minReplicas=0)
    invalid = build_ledger(None, [], invalid="ModelBudget gpus is invalid: spec.memory: too large")
    first = plan(view(spec), [], invalid, now=NOW)
    assert cond(first, "BudgetExceeded") == ("True", BUDGET_INVALID)
    then = plan(view(spec, first.status), [], missing_ledger(), now=at(1001))
    assert cond(then, "BudgetExceeded") == ("True", BUDGET_MISSING)
    assert [e.reason for e in then.events if "Budget" in e.reason] == [BUDGET_MISSING]


def test_a_pool_that_wants_nothing_still_shows_the_budget_is_missing() -> None:
    workers = [w("p-a")]
    out = plan(view(make_spec(replicas=1)), workers, missing_ledger("gpus", *workers), now=NOW)
    assert cond(out, "BudgetExceeded") == ("False", BUDGET_MISSING)


def test_with_admit_chosen_a_missing_budget_admits() -> None:
    limit = budget_limit({}, "gpus", missing="admit")
    out = plan(view(make_spec(replicas=2)), [], build_ledger(limit.total, []), now=NOW)
    assert len(out.create) == 2 and cond(out, "BudgetExceeded") == ("False", "WithinBudget")


# ---- settings ------------------------------------------------------------------------------------------


def test_settings_missing_budget_and_budget_create() -> None:
    assert OperatorConfig().missing_budget == "admit"  # the bare process; the chart sets refuse
    assert OperatorConfig(missing_budget="refuse").missing_budget == "refuse"
    made = OperatorConfig(budget_create=True, budget_memory="640Gi")
    assert made.budget_create and made.budget_memory == "640Gi"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--missing-budget", "sometimes"], "MISSING_BUDGET.*'admit' or 'refuse'"),
        (["--budget-create"], "budget_create needs budget_memory"),
        (["--budget-create", "--budget-memory", "lots"], "budget_memory: invalid quantity 'lots'"),
    ],
)
def test_bad_budget_settings_are_refused_with_a_clear_message(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args(build_parser().parse_args(argv))


# ---- the create ----------------------------------------------------------------------------------------


class BudgetApi:
    """The API server's answers to a ModelBudget create: ``fail`` errors first, then 201, or 409 when one
    of that name exists (which is never changed)."""

    def __init__(self, existing: Mapping[str, Any] | None = None, fail: int = 0) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        if existing is not None:
            self.objects[existing["metadata"]["name"]] = dict(existing)
        self.fail = fail
        self.calls = 0

    async def create_budget(self, body: Mapping[str, Any]) -> bool:
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise ApiException(status=503, reason="Service Unavailable")
        name = body["metadata"]["name"]
        if name in self.objects:
            return False
        self.objects[name] = dict(body)
        return True


def test_budget_body_is_the_model_budget_of_the_settings() -> None:
    body = budget_body("gpus", "640Gi")
    assert body["apiVersion"] == "modelpool.dev/v1alpha1" and body["kind"] == "ModelBudget"
    assert body["metadata"]["name"] == "gpus" and body["spec"] == {"memory": "640Gi"}
    assert "finalizers" not in body["metadata"]


def test_create_makes_the_budget_once_and_never_changes_an_existing_one() -> None:
    api = BudgetApi()
    assert asyncio.run(create_budget_until_done(api, "gpus", "640Gi")) is True  # type: ignore[arg-type]
    # A restart (or an upgrade) with other values: the user's budget stays as it is.
    api.objects["gpus"]["spec"] = {"memory": "700Gi"}  # changed by kubectl
    assert asyncio.run(create_budget_until_done(api, "gpus", "80Gi")) is False  # type: ignore[arg-type]
    assert api.objects["gpus"]["spec"] == {"memory": "700Gi"}


def test_create_is_retried_until_the_api_server_answers() -> None:
    api = BudgetApi(fail=3)
    made = asyncio.run(create_budget_until_done(api, "gpus", "1Ti", base_s=0.001, cap_s=0.002))  # type: ignore[arg-type]
    assert made is True and api.calls == 4 and api.objects["gpus"]["spec"] == {"memory": "1Ti"}
