"""The short soak (about two minutes, on a control plane of its own): the same rig, clients, faults and
auditor as ``python -m bench.soak``, with one MiniLM pool and one KWOK pool, and a fixed seed whose
schedule holds a worker kill, a KWOK OOM kill, an operator kill, a gateway kill and a control-plane
(etcd + API server) restart.  Any invariant violation fails it, named with the event that showed it."""

from __future__ import annotations

import pytest

from bench.soak import schedule as sched
from bench.soak.__main__ import SHORT_PLAN, required_faults, run
from bench.soak.report import table
from testkit.cluster import minilm_package, require_prerequisites

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
SEED = 3
SECONDS = 40
SPACING = 8


def test_short_soak_breaks_no_invariant() -> None:
    require_prerequisites()
    minilm_package()
    faults = sched.schedule(SEED, SECONDS, SPACING, required_faults(SECONDS / 60))
    kinds = {f.kind for f in faults}
    assert {sched.WORKER_KILL, sched.KWOK_OOM, sched.OPERATOR_KILL, sched.GATEWAY_KILL} <= kinds
    assert sched.CONTROL_PLANE_RESTART in kinds
    result = run(
        SECONDS / 60,
        SEED,
        plan=SHORT_PLAN,
        spacing=SPACING,
        command="tests/cluster/test_soak_short.py",
        faults=faults,
    )
    print(table(result))
    applied = {kind for kind, (done, _) in result.faults.items() if done}
    # Each required fault struck something (none skipped for want of a target).
    assert kinds <= applied, f"faults that found nothing to act on: {kinds - applied}\n{table(result)}"
    assert sum(n for outcome, n in result.requests.items() if outcome.startswith("answered 200")) > 0
    assert result.ok, table(result)
