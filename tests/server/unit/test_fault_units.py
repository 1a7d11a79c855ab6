"""The fault paths' decisions, as pure functions: when a forward pass counts as wedged (and liveness on
the probe port fails), the supervisor's verdict on a drain that timed out, its termination message."""

from __future__ import annotations

import pytest

from model_server.config import WEDGE_GRACE_S, ServerConfig
from model_server.engine.inference_process import drain_timed_out
from model_server.state_machine import State, StateMachine
from model_server.supervisor.probe_server import answer
from model_server.supervisor.supervisor import verdict
from model_server.worker_stats import wedged_batch
from model_server.worker_view import Field, WorkerView
from modelpool_contract.exits import EXIT_DRAIN_TIMED_OUT, EXIT_PROCESS_DIED


@pytest.mark.parametrize(
    ("started", "now", "expected"),
    [
        (None, 1000.0, ""),  # no batch runs
        (1000.0, 1090.0, ""),  # exactly at the bound: still within it
        (1000.0, 1040.0, ""),
        (
            1000.0,
            1093.2,
            "inference wedged: batch running for 93 s, over the 60 s request timeout + 30 s grace",
        ),
    ],
)
def test_a_batch_is_wedged_past_the_request_timeout_plus_the_grace(
    started: float | None, now: float, expected: str
) -> None:
    assert wedged_batch(started, now, request_timeout=60, grace=30) == expected


def test_liveness_fails_on_the_probe_port_while_a_batch_is_wedged() -> None:
    config = ServerConfig(model="/", task="text-embedding", name="echo", request_timeout=2, wedge_grace=1)
    assert ServerConfig(model="/", task="text-embedding").wedge_grace == WEDGE_GRACE_S
    view = WorkerView(config.queue_capacity, http_processes=1)
    machine = StateMachine(store=view.state_store())
    for state in (State.LOADING, State.READY, State.PROCESSING):
        machine.to(state)
    now = 1000.0
    view.set(Field.BATCH_STARTED, now - 3.0)
    assert answer("/v2/health/live", config, view, machine, now) == (
        200,
        {"live": True, "state": "Processing"},
    )
    view.set(Field.BATCH_STARTED, now - 3.5)
    status, body = answer("/v2/health/live", config, view, machine, now)
    assert status == 503 and body["reason"].startswith("inference wedged: batch running for 4 s"), body
    view.set(Field.BATCH_STARTED, float("nan"))  # the batch ended
    assert answer("/v2/health/live", config, view, machine, now)[0] == 200


def test_a_drain_that_timed_out_ends_the_worker_with_its_own_code_and_reason() -> None:
    reason = drain_timed_out(30, 3)
    assert reason == "drain timed out after 30 s: 3 requests abandoned"
    assert drain_timed_out(0.5, 1) == "drain timed out after 0.5 s: 1 request abandoned"
    assert verdict("inference", 7, EXIT_DRAIN_TIMED_OUT, reason, draining=True) == (
        EXIT_DRAIN_TIMED_OUT,
        reason,
    )
    # Unasked (no SIGTERM), the same exit is a process that died.
    assert verdict("inference", 7, EXIT_DRAIN_TIMED_OUT, reason, draining=False)[0] == EXIT_PROCESS_DIED
