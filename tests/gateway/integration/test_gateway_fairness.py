"""Fair shares of a full pool (issue 34 item 3) with the real gateway, operator and workers: a worker of
queue capacity 2 computing one request at a time behind a gate, key A flooding it and key B sending
steadily.

Counted by the worker's own record of the order it ran requests in (gates, not timings): with the pool
full, every slot that frees goes to exactly one waiting request, so the worker runs them in the order the
gateway's fair queue released them. B's *goodput* is how many of its requests run within the first
``2 n + 2`` the worker runs: alone, all ``n``; under A's flood (queued before B's, first come would run
every one of A's first) at least 0.9 of that. A key of weight 3 gets three slots to the flood's one.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testkit.cluster import Cluster
from testkit.kubectl import wait_for
from tests.gateway.integration.gwharness import GatewayProcess, bearer, create_key, echo_pool, serving_stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

POOL = "fair"
FLOOD = 30  # A's requests waiting before B's
STEADY = 10  # B's


@dataclass
class Setup:
    cluster: Cluster
    namespace: str
    gateway: GatewayProcess
    gate: Path
    record: Path

    def key(self, name: str, weight: int | None = None) -> str:
        assert self.gateway.keys_namespace is not None
        return create_key(
            self.cluster, self.gateway.keys_namespace, name, namespaces=self.namespace, weight=weight
        )

    def metric(self, name: str) -> float:
        return self.gateway.metric(name, pool=f"{self.namespace}/{POOL}")


@pytest.fixture(scope="module")
def setup(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    # /dev/shm: a directory the test and the process-node worker both see (test_gateway_holds.host_dir).
    shared = Path(tempfile.mkdtemp(prefix="gw-fair-", dir="/dev/shm"))
    gate, record = shared / "open", shared / "record.txt"
    logs = tmp_path_factory.mktemp("gateway-fairness")
    env = {"HANDLER_RUN_GATE": str(gate), "HANDLER_RECORD": str(record)}
    # Autoscaling off; its target per worker (unused) must fit the small queue all the same.
    off = {"enabled": False, "targetPerWorker": 1}
    pool = echo_pool(POOL, env=env, queue_capacity=2, max_batch_size=1, autoscaling=off)
    try:
        with serving_stack(crds, "gwf", logs, [(pool, 1)], "--max-queued-per-key", "50") as stack:
            try:
                yield Setup(crds, stack.namespace, stack.gateway, gate, record)
            finally:
                gate.touch()  # nothing left waiting in the worker before the pool goes
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _known(gateway: GatewayProcess, key: str) -> None:
    wait_for(
        lambda: httpx.get(gateway.url + "/v1/models", headers=bearer(key), timeout=5).status_code == 200,
        timeout=10,
        interval=0.1,
        message="the gateway knows the key",
    )


class Round:
    """One run: the gate closed, requests sent from threads (each waited for until the gateway has it in
    flight or queued), then the gate opened and every answer awaited; the worker's run order returned."""

    def __init__(self, setup: Setup, pool: ThreadPoolExecutor) -> None:
        self.setup, self.pool = setup, pool
        self.sent: list[Future[httpx.Response]] = []
        setup.gate.unlink(missing_ok=True)
        setup.record.write_text("")

    def send(self, key: str, texts: list[str]) -> None:
        url = self.setup.gateway.url + "/v1/embeddings"
        for text in texts:
            body = {"model": POOL, "input": [text]}
            self.sent.append(self.pool.submit(httpx.post, url, json=body, headers=bearer(key), timeout=120))
            count = len(self.sent)

            def arrived(n: int = count) -> bool:
                done = [f.result() for f in self.sent if f.done()]
                assert not done, [(r.status_code, r.text[:300]) for r in done]  # none may end yet
                inside = self.setup.metric("modelpool_gateway_in_flight_requests")
                return inside + self.setup.metric("modelpool_gateway_queued_requests") == n

            wait_for(arrived, timeout=30, interval=0.02, message=f"{count} requests in the gateway")

    def finish(self) -> list[str]:
        assert self.setup.metric("modelpool_gateway_in_flight_requests") == 2  # the pool's capacity
        self.setup.gate.touch()
        codes = [future.result(timeout=120).status_code for future in self.sent]
        assert codes == [200] * len(codes), codes
        return self.setup.record.read_text().split()


def _goodput(order: list[str], prefix: str, n: int) -> int:
    """How many of ``prefix``'s requests the worker ran within its first 2n + 2."""
    return sum(text.startswith(prefix) for text in order[: 2 * n + 2])


def test_a_flood_from_one_key_leaves_another_key_its_goodput(setup: Setup) -> None:
    flood, steady = setup.key("flood"), setup.key("steady")
    _known(setup.gateway, flood)
    _known(setup.gateway, steady)
    with ThreadPoolExecutor(max_workers=FLOOD + STEADY + 2) as pool:
        alone = Round(setup, pool)
        alone.send(steady, [f"b{i}" for i in range(STEADY)])
        alone_goodput = _goodput(alone.finish(), "b", STEADY)
        assert alone_goodput == STEADY

        flooded = Round(setup, pool)
        flooded.send(flood, [f"a{i}" for i in range(FLOOD + 2)])  # 2 fill the worker, the rest wait
        assert setup.metric("modelpool_gateway_queued_requests") == FLOOD
        flooded.send(steady, [f"b{i}" for i in range(STEADY)])  # behind all of them
        order = flooded.finish()
    assert sorted(order) == sorted([f"a{i}" for i in range(FLOOD + 2)] + [f"b{i}" for i in range(STEADY)])
    goodput = _goodput(order, "b", STEADY)
    assert goodput >= 0.9 * alone_goodput, order
    # First come would have run every one of A's first: B's requests arrived behind 30 of them.
    assert order.index("b0") < 4, order


def test_weights_share_the_slots_three_to_one(setup: Setup) -> None:
    flood, heavy = setup.key("flood-2"), setup.key("heavy", weight=3)
    _known(setup.gateway, flood)
    _known(setup.gateway, heavy)
    with ThreadPoolExecutor(max_workers=44) as pool:
        run = Round(setup, pool)
        run.send(flood, [f"a{i}" for i in range(22)])
        run.send(heavy, [f"h{i}" for i in range(20)])
        order = run.finish()
    # After the 2 that filled the worker: while both keys wait, 3 of the heavy key's per 1 of the flood's.
    window = order[2:18]
    assert sum(t.startswith("h") for t in window) == 12, order
