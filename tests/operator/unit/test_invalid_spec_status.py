"""A spec the CRD admits but the operator's model refuses (``resources.memory: 0``, found by the manifest
fuzzer): the pool's status says why in a condition, not only in an Event."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from modelpool_contract.api import parse_pool_spec
from modelpool_operator.refusals import INVALID_SPEC, invalid_spec_message, invalid_spec_status

NOW = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)


def refusal(spec: dict[str, object]) -> Exception:
    with pytest.raises(ValueError) as err:
        parse_pool_spec(spec)
    return err.value


def test_the_message_names_each_field() -> None:
    exc = refusal({"model": {"source": "/m", "task": "text-embedding"}, "resources": {"memory": 0}})
    assert invalid_spec_message(exc) == "invalid spec: spec.resources.memory must be greater than 0"
    exc = refusal(
        {"model": {"source": "/m", "task": "text-embedding"}, "resources": {"memory": "1Gi", "cpu": "9999Ei"}}
    )
    message = invalid_spec_message(exc)
    assert message.startswith("invalid spec: spec.resources.cpu") and "\n" not in message


def test_the_status_is_failed_with_a_ready_false_condition() -> None:
    status = invalid_spec_status([], 3, "invalid spec: resources.memory must be greater than 0", NOW)
    assert status["phase"] == "Failed" and status["observedGeneration"] == 3
    [ready] = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", INVALID_SPEC)
    assert ready["message"] == "invalid spec: resources.memory must be greater than 0"
    assert ready["observedGeneration"] == 3
