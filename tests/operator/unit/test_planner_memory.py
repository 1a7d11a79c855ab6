"""Declared against measured memory: the accelerator memory a worker reports reaches its status, the pool's
figures for `kubectl get -o wide`, and the MemoryExceedsCharge condition and Event (docs/operator-api.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from modelpool_contract.api import ModelPoolStatus
from modelpool_operator.budget import build_ledger
from modelpool_operator.observe.worker_state import ObservedWorker, observe_worker
from modelpool_operator.planner import Plan, plan
from tests.operator.unit.op_planner import make_spec, view, w
from tests.operator.unit.op_pods import GI, at, pod, stats

NOW = at(100)


def gpu_pod(name: str = "w-0", gpus: str = "1", **kwargs: Any) -> dict[str, Any]:
    body = pod(name, ready=True, **kwargs)
    body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
    return body


def gpu_stats(reserved: int, peak: int | None) -> dict[str, Any]:
    memory = {"rss_bytes": 1, "gpu_allocated_bytes": reserved // 2, "gpu_reserved_bytes": reserved}
    return stats("Ready", memory={**memory, "gpu_peak_reserved_bytes": peak})


def test_a_gpu_worker_reports_reserved_and_peak_accelerator_memory() -> None:
    worker = observe_worker(gpu_pod(), gpu_stats(3 * GI, 5 * GI), NOW)
    assert (worker.accelerator_reserved, worker.accelerator_peak) == (3 * GI, 5 * GI)
    entry = worker.to_status().wire()
    assert entry["acceleratorMemory"] == {
        "reserved": "3Gi",
        "reservedBytes": 3 * GI,
        "peak": "5Gi",
        "peakBytes": 5 * GI,
    }


@pytest.mark.parametrize(
    ("body", "report"),
    [
        (pod(ready=True), gpu_stats(3 * GI, 5 * GI)),  # a CPU pod: no accelerator, whatever /stats says
        (gpu_pod(gpus="0"), gpu_stats(3 * GI, 5 * GI)),
        (gpu_pod(), None),  # stats unknown (KWOK, unreachable)
        (gpu_pod(), stats("Ready", memory=None)),
    ],
)
def test_accelerator_memory_is_absent_without_an_accelerator_or_stats(
    body: dict[str, Any], report: dict[str, Any] | None
) -> None:
    worker = observe_worker(body, report, NOW)
    assert worker.accelerator_reserved is None and worker.accelerator_peak is None
    assert "acceleratorMemory" not in worker.to_status().wire()


def measured(worker: ObservedWorker, reserved: int, peak: int | None) -> ObservedWorker:
    return replace(worker, accelerator_reserved=reserved, accelerator_peak=peak)


def run(workers: list[ObservedWorker], status: ModelPoolStatus | None = None) -> Plan:
    spec = make_spec(replicas=len(workers), resources={"memory": "4Gi", "gpus": 1})
    return plan(view(spec, status), workers, build_ledger(None, workers, ()), now=NOW)


def memory_condition(out: Plan) -> tuple[str, str, str]:
    c = next(c for c in out.status.conditions if c.type == "MemoryExceedsCharge")
    return c.status, c.reason, c.message


def test_a_worker_above_its_charge_is_named_with_the_numbers_once() -> None:
    workers = [
        measured(w("w-0", memory=4 * GI), 3 * GI, int(6.5 * GI)),
        measured(w("w-1", memory=4 * GI), 2 * GI, 3 * GI),
    ]
    out = run(workers)
    status, reason, message = memory_condition(out)
    assert (status, reason) == ("True", "MeasuredAboveCharge")
    assert "worker w-0 needed 6.5Gi of accelerator memory but is charged 4Gi" in message
    assert "raise spec.resources.memory to at least 6.5Gi" in message and "w-1" not in message
    warnings = [e for e in out.events if e.reason == "MemoryExceedsCharge"]
    assert [e.type for e in warnings] == ["Warning"] and "w-0" in warnings[0].message
    assert out.status.memory.declared == "4Gi"
    assert (out.status.memory.measured_peak, out.status.memory.measured_peak_bytes) == (
        "6656Mi",
        int(6.5 * GI),
    )
    # The next pass, from the status just written: still True, but no second Event.
    again = run(workers, out.status)
    assert memory_condition(again)[0] == "True"
    assert not [e for e in again.events if e.reason == "MemoryExceedsCharge"]
    before, after = (
        next(c for c in p.status.conditions if c.type == "MemoryExceedsCharge") for p in (out, again)
    )
    assert after.last_transition_time == before.last_transition_time


def test_without_a_peak_the_reserved_memory_is_compared() -> None:
    out = run([measured(w("w-0", memory=4 * GI), 5 * GI, None)])
    assert memory_condition(out)[:2] == ("True", "MeasuredAboveCharge")


def test_workers_within_their_charge() -> None:
    out = run([measured(w("w-0", memory=4 * GI), 3 * GI, 4 * GI)])
    assert memory_condition(out)[:2] == ("False", "WithinCharge")
    assert not [e for e in out.events if e.reason == "MemoryExceedsCharge"]
    assert out.status.memory.measured_peak == "4Gi"


def test_unmeasured_pools_and_failed_workers_raise_nothing() -> None:
    out = run([w("w-0", memory=4 * GI), w("w-1", memory=4 * GI)])
    assert memory_condition(out)[:2] == ("False", "NotMeasured")
    assert out.status.memory.measured_peak is None and out.status.memory.declared == "4Gi"
    # A failed worker is charged nothing and holds nothing: its last report is no finding.
    failed = run([measured(w("w-0", "Failed", memory=4 * GI), 9 * GI, 9 * GI)])
    assert memory_condition(failed)[0] == "False"
    assert not [e for e in failed.events if e.reason == "MemoryExceedsCharge"]


def test_a_missed_scrape_keeps_the_last_measurement() -> None:
    """A worker whose /stats is unknown for a pass (a timeout) keeps what it last reported: the condition
    does not flap and no second Event is posted; a worker that reports again replaces it."""
    over = measured(w("w-0", memory=4 * GI), 5 * GI, 6 * GI)
    first = run([over])
    silent = replace(over, stats_known=False, accelerator_reserved=None, accelerator_peak=None)
    second = run([silent], first.status)
    assert memory_condition(second)[:2] == ("True", "MeasuredAboveCharge")
    assert second.status.workers[0].accelerator_memory == first.status.workers[0].accelerator_memory
    assert not [e for e in second.events if e.reason == "MemoryExceedsCharge"]
    back = run([measured(w("w-0", memory=4 * GI), 3 * GI, 3 * GI)], second.status)
    assert memory_condition(back)[:2] == ("False", "WithinCharge")
