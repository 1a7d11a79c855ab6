"""A ModelHost's daemon (``handlers.host_daemon``) runs its passes as a pool's daemon does: each in one of
the process's pass slots (``PassGate``, ``MAX_PASSES_IN_FLIGHT``), and a failed pass told as a Warning
Event ``ReconcileError`` once per distinct error (``daemon_loop.tell_pass_error``; it was a log line only):
both run ``daemon_loop.run_passes``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

from modelpool_operator import daemon_loop
from modelpool_operator import handlers as operator_handlers
from modelpool_operator.bookkeeping import PassGate
from modelpool_operator.metrics import OperatorMetrics
from modelpool_operator.observe.observation import ObservationCache
from modelpool_operator.planner import Event
from modelpool_operator.services import Services, lifecycle_settings
from modelpool_operator.settings import OperatorConfig
from testkit.waiting import wait_for_async
from tests.operator.unit import op_handlers


class Told:
    """An ``EventSink`` that keeps what it was given, by object name."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, Event]] = []

    def post(self, body: Mapping[str, Any], event: Event) -> None:
        self.posted.append((body["metadata"]["name"], event))


async def test_a_modelhost_pass_waits_for_a_pass_slot_and_tells_each_new_error_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = OperatorConfig(stats_interval_seconds=60, resync_interval_seconds=60)
    memo = operator_handlers.make_memo(config)
    memo.book.passes = PassGate(1)
    told = Told()
    memo.services = Services(  # only the Event sink is used: the passes are stand-ins
        config=config,
        kube=None,  # type: ignore[arg-type]
        scraper=None,  # type: ignore[arg-type]
        observations=ObservationCache(lifecycle_settings(config)),
        events=told,
        metrics=OperatorMetrics(),
        host_control=None,  # type: ignore[arg-type]
        control_seed=b"0" * 32,
    )
    hold, pool_passes, host_passes, error = asyncio.Event(), [0], [0], ["boom"]

    async def pool_pass(*args: object, **kwargs: object) -> None:
        pool_passes[0] += 1
        await hold.wait()

    async def host_pass(*args: object, **kwargs: object) -> None:
        host_passes[0] += 1
        raise RuntimeError(error[0])

    monkeypatch.setattr(operator_handlers, "reconcile_pool", pool_pass)
    monkeypatch.setattr(operator_handlers, "reconcile_host", host_pass)
    monkeypatch.setattr(daemon_loop, "ERROR_DELAY_S", 0.02)
    stop: FlagSetter[kopf.DaemonStoppingReason] = FlagSetter()
    common: dict[str, Any] = dict(
        namespace="ns", memo=memo, logger=logging.getLogger("t"), stopped=AsyncFlagWaiter(stop),
        pods_by_pool={}, pools_by_key={}, budgets_by_name={}, pool_owners={}, host_owners={},
    )  # fmt: skip
    pool = asyncio.create_task(
        op_handlers.pool_daemon(
            name="p", body={"metadata": {"name": "p"}}, demand_by_pool={}, hosts_by_key={}, **common
        )
    )
    await wait_for_async(lambda: pool_passes[0] == 1, 5, message="the pool's pass holds the one slot")
    host = asyncio.create_task(
        op_handlers.host_daemon(name="gpus", body={"metadata": {"name": "gpus"}}, **common)
    )
    await wait_for_async(lambda: memo.book.passes.waiting == 1, 5, message="the ModelHost waits for a slot")
    assert host_passes[0] == 0
    hold.set()
    # Its passes fail again and again: one Event for the error, not one a pass.
    await wait_for_async(lambda: host_passes[0] >= 3, 5, message="the ModelHost's passes run, and fail")
    assert [(name, e.type, e.reason, e.message) for name, e in told.posted] == [
        ("gpus", "Warning", "ReconcileError", "RuntimeError: boom")
    ]
    error[0] = "bang"  # another error: told
    await wait_for_async(lambda: len(told.posted) == 2, 5, message="the new error told")
    assert told.posted[-1][1].message == "RuntimeError: bang" and memo.book.passes.peak == 1
    stop.set()
    await asyncio.wait_for(asyncio.gather(pool, host), 5)
