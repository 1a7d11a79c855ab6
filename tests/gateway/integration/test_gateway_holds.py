"""Requests for a pool with no serving worker: held (bounded in number and time), released in arrival
order when a worker is Ready, answered 429 when the hold is full and 503 with the reason when it expires;
the demand is recorded in the pool's demand Lease (never on the pool), each gateway replica's share once per
interval while it holds requests, and the Lease shows the sum of the replicas' live shares.

Waking a pool from zero is the operator's side of the demand contract and is not tested here: the pools
below either cannot start (a budget too small; or they wake on demand but live in the "quiet" namespace,
which the gateways watch and no operator does) or are loading behind a gate the test opens.  A pool that
can never get a worker (replicas 0, autoscaling off) is not held at all: 503 at once.
"""

from __future__ import annotations

import functools
import itertools
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelpool_contract.demand import (
    SHARE_PREFIX,
    demand_from_lease,
    demand_lease_name,
    read_demand,
    share_annotation,
)
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, get_json, wait_for
from testkit.watch import ListWatch
from tests.gateway.integration.gwharness import GatewayProcess, echo_pool
from tests.operator.integration.opharness import (
    POOLS,
    OperatorProcess,
    condition,
    get_pool,
    wait_status,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HELD = "modelpool_gateway_held_requests"
LEASES = "leases.coordination.k8s.io"


@dataclass
class Setup:
    cluster: Cluster
    namespace: str
    # Watched by the gateways, not by the operator: a pool here is held until its timeout.
    quiet: str
    gateway: GatewayProcess
    logs: Path
    extra: list[GatewayProcess] = field(default_factory=list)

    def held(self, pool: str, gateway: GatewayProcess | None = None, namespace: str | None = None) -> float:
        return (gateway or self.gateway).metric(HELD, pool=f"{namespace or self.namespace}/{pool}")


def waking_pool(name: str, activation_timeout_seconds: int) -> dict[str, Any]:
    """A pool at zero that wakes on demand (autoscaling on): held while no worker comes."""
    return echo_pool(
        name,
        replicas=0,
        autoscaling={},
        max_replicas=1,
        activation_timeout_seconds=activation_timeout_seconds,
    )


@pytest.fixture(scope="module")
def setup(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    namespace = f"gwh-{uuid.uuid4().hex[:8]}"
    quiet = f"{namespace}-quiet"
    crds.kubectl("create", "namespace", namespace)
    crds.kubectl("create", "namespace", quiet)
    logs = tmp_path_factory.mktemp("gateway-holds")
    operator = OperatorProcess(
        crds, [namespace], logs / "operator.log", MODELPOOL_OPERATOR_SERVER_PORT=str(free_port())
    )
    flags = ("--max-held-per-pool", "3", "--hold-retry-after-seconds", "7", "--demand-interval-seconds", "1")
    try:
        gateway = GatewayProcess(crds, [namespace, quiet], logs / "gateway.log", *flags)
    except BaseException:
        operator.stop()  # the gateway could not start: the operator must not outlive the session
        raise
    setup = Setup(crds, namespace, quiet, gateway, logs)
    try:
        wait_for(lambda: crds.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0,
                 timeout=30, message="default ServiceAccount")  # fmt: skip
        gateway.wait_ready()
        yield setup
    finally:
        crds.kubectl("delete", POOLS, "--all", "-n", namespace, "--timeout=60s", check=False)
        codes = [g.stop() for g in (gateway, *setup.extra)] + [operator.stop()]
        for each in (namespace, quiet):
            crds.kubectl("delete", "namespace", each, "--wait=false", check=False)
        assert codes == [0] * len(codes), f"exit codes: {codes}\n{gateway.log_tail()}\n{operator.log_tail()}"


def _post(
    gateway: GatewayProcess, model: str, text: str = "hello", timeout_header: float | None = None
) -> httpx.Response:
    headers = {"x-request-timeout": str(timeout_header)} if timeout_header else {}
    return httpx.post(
        gateway.url + "/v1/embeddings",
        json={"model": model, "input": [text]},
        headers={**gateway.headers, **headers},
        timeout=120,
    )


class Background:
    """Requests sent from threads; their responses collected in the order they complete."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.responses: dict[int, httpx.Response] = {}

    def send(self, index: int, call: Callable[[], httpx.Response]) -> None:
        def run() -> None:
            self.responses[index] = call()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout: float = 120) -> dict[int, httpx.Response]:
        for thread in self.threads:
            thread.join(timeout)
        return self.responses


def test_a_full_hold_is_refused_at_once_with_429_and_retry_after(setup: Setup) -> None:
    apply(setup.cluster, waking_pool("zero", activation_timeout_seconds=30), setup.quiet)
    wait_for(lambda: "zero" in setup.gateway.models(), timeout=30, message="the gateway knows pool zero")
    held = Background()
    for i in range(3):  # the gateway holds at most 3 per pool; each client gives up after 6 s
        held.send(i, lambda: _post(setup.gateway, "zero", timeout_header=6))
    wait_for(lambda: setup.held("zero", namespace=setup.quiet) == 3, timeout=10, message="three held")

    started = time.monotonic()
    refused = _post(setup.gateway, "zero")
    assert time.monotonic() - started < 2, "a full hold answers at once"
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "7"
    error = refused.json()["error"]
    assert error["type"] == "overloaded" and "already holds 3 requests" in error["message"]
    v2 = httpx.post(
        f"{setup.gateway.url}/v2/models/zero/infer",
        json={"inputs": []},
        headers=setup.gateway.headers,
        timeout=10,
    )
    assert v2.status_code == 429 and set(v2.json()) == {"error"}

    # The held ones end at their clients' own deadline (6 s < activationTimeoutSeconds 30) with a 503.
    responses = held.join()
    assert [r.status_code for r in responses.values()] == [503] * 3
    assert all(5.5 <= r.elapsed.total_seconds() < 20 for r in responses.values())
    assert setup.held("zero", namespace=setup.quiet) == 0


def test_an_expired_hold_says_why_no_worker_comes_and_the_demand_is_recorded(
    setup: Setup,
) -> None:
    apply(setup.cluster, waking_pool("idle", activation_timeout_seconds=2), setup.quiet)
    wait_for(lambda: "idle" in setup.gateway.models(), timeout=30, message="the gateway knows pool idle")
    before = time.time()
    response = _post(setup.gateway, "idle")
    assert response.status_code == 503, response.text
    assert 1.9 <= response.elapsed.total_seconds() < 10, "held for activationTimeoutSeconds (2 s)"
    error = response.json()["error"]
    # No operator acts on the quiet namespace: the answer says the demand waits for it.
    assert error["type"] == "waiting_for_operator"
    assert f"pool {setup.quiet}/idle has no worker: waiting for the operator" in error["message"]
    assert "retry-after" in response.headers

    lease = get_json(setup.cluster, LEASES, demand_lease_name("idle"), "-n", setup.quiet)
    recorded = demand_from_lease(lease)
    assert recorded is not None, lease
    assert before - 1 <= recorded.timestamp() <= time.time() + 1
    pool = get_pool(setup.cluster, setup.quiet, "idle")
    assert [o["uid"] for o in lease["metadata"]["ownerReferences"]] == [pool["metadata"]["uid"]]
    assert "modelpool.dev/demanded-at" not in (pool["metadata"].get("annotations") or {})


def test_a_pool_that_can_never_wake_is_answered_503_at_once(setup: Setup) -> None:
    # replicas 0 with autoscaling off: the operator starts no worker for demand, so nothing is held.
    apply(setup.cluster, echo_pool("never", replicas=0, activation_timeout_seconds=60), setup.namespace)
    wait_for(lambda: "never" in setup.gateway.models(), timeout=30, message="the gateway knows pool never")
    response = _post(setup.gateway, "never")
    assert response.status_code == 503, response.text
    assert response.elapsed.total_seconds() < 2, "not held for activationTimeoutSeconds (60 s)"
    error = response.json()["error"]
    assert error["type"] == "scaled_to_zero"
    assert f"pool {setup.namespace}/never has no worker and the operator starts none" in error["message"]
    assert "scale it up" in error["message"]
    refused = setup.gateway.metric(
        "modelpool_gateway_refused_total", pool=f"{setup.namespace}/never", reason="scaled_to_zero"
    )
    assert refused == 1
    leases = get_json(setup.cluster, LEASES, "-n", setup.namespace)["items"]
    assert demand_lease_name("never") not in [lease["metadata"]["name"] for lease in leases]


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A directory the test and a process-node worker both see and the worker may write to: /dev/shm,
    which stays writable under the worker's read-only root (a container's own tmpfs); not under /tmp,
    which the process node maps to the pod's own emptyDir (its path rewrite would give the worker a
    private copy)."""
    path = Path(tempfile.mkdtemp(prefix="gw-test-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_still_loading_then_released_to_the_worker_in_arrival_order(setup: Setup, host_dir: Path) -> None:
    gate, record = host_dir / "loaded", host_dir / "record.txt"
    env = {"HANDLER_LOAD_GATE": str(gate), "HANDLER_RECORD": str(record)}
    apply(setup.cluster, echo_pool("slow", env=env, activation_timeout_seconds=120), setup.namespace)
    wait_status(
        setup.cluster,
        setup.namespace,
        "slow",
        lambda s: any(w["state"] == "Loading" for w in s.get("workers") or []),
        timeout=120,
        message="the worker is Loading",
    )
    # A client deadline shorter than the hold: the 503 says the worker is still loading, and for how long.
    response = _post(setup.gateway, "slow", timeout_header=1.5)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["type"] == "loading"
    assert "is still loading: worker slow-" in error["message"] and "has been Loading for" in error["message"]

    # Three held requests, each sent once the previous one is held; then the model finishes loading.
    held = Background()
    for i in range(3):
        held.send(i, functools.partial(_post, setup.gateway, "slow", text=f"request-{i}"))

        def holding(count: int = i + 1) -> bool:
            return setup.held("slow") == count

        wait_for(holding, timeout=10, message=f"{i + 1} held")
    gate.touch()
    responses = held.join()
    assert {i: r.status_code for i, r in responses.items()} == {0: 200, 1: 200, 2: 200}, [
        r.text for r in responses.values()
    ]
    assert record.read_text().split() == ["request-0", "request-1", "request-2"]


def test_a_full_budget_answers_503_budget_exceeded_without_the_budgets_figures(
    setup: Setup, budget: Callable[[str], None]
) -> None:
    budget("1Gi")
    apply(setup.cluster, echo_pool("big", memory="2Gi", activation_timeout_seconds=2), setup.namespace)
    status = wait_status(
        setup.cluster,
        setup.namespace,
        "big",
        lambda s: condition(s, "BudgetExceeded").get("status") == "True",
        timeout=60,
        message="the operator cannot admit the worker",
    )
    figures = condition(status, "BudgetExceeded")["message"]
    wait_for(lambda: setup.gateway.models().get("big"), timeout=10, message="the gateway knows pool big")
    response = _post(setup.gateway, "big")
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["type"] == "budget_exceeded"
    # Named, without the condition's figures: they describe the whole cluster's memory (other tenants').
    assert "budget" in error["message"] and figures not in error["message"], (error["message"], figures)
    assert "Gi" not in error["message"] and "free" not in error["message"], error["message"]


class LeaseWatch:
    """Every write the pool's Lease records (its renewTime and writer), from a watch in a thread (not by
    sampling), from before the Lease exists."""

    def __init__(self, cluster: Cluster, namespace: str, pool: str) -> None:
        self.values: list[tuple[datetime, str]] = []
        self._watch = ListWatch(
            cluster.kubeconfig, "CoordinationV1Api", "list_namespaced_lease", namespace,
            field_selector=f"metadata.name={demand_lease_name(pool)}",
            on_list=lambda _leases: None, on_event=self._seen, watch_seconds=1,
        )  # fmt: skip

    def start(self) -> LeaseWatch:
        self._watch.start(timeout=30)
        return self

    def stop(self) -> None:
        self._watch.stop(10)

    def _seen(self, _kind: str, lease: dict[str, Any]) -> None:
        value = demand_from_lease(lease)
        if value and (not self.values or self.values[-1][0] != value):
            self.values.append((value, str(lease["spec"].get("holderIdentity"))))


def _holder(gateway: GatewayProcess) -> str:
    """A gateway process's holderIdentity (``modelpool_gateway.main.replica_identity``: host name, pid)."""
    return f"{socket.gethostname()}_{gateway.proc.pid}"


def test_two_gateways_each_record_their_share_and_the_lease_shows_the_sum(setup: Setup) -> None:
    """Issue 31: two gateway processes hold requests for one pool at zero (3 and 2): the demand Lease, as
    the operator reads it (``read_demand``, the index's reader), shows 5 held, not the last writer's count;
    each replica writes its own share about once per interval (1 s), no more; when the second's holds end,
    its share stops counting within the lease duration (2 s) and the first's next write prunes it."""
    second = GatewayProcess(
        setup.cluster,
        [setup.namespace, setup.quiet],
        setup.logs / "gateway-2.log",
        "--max-held-per-pool", "3", "--demand-interval-seconds", "1",
    )  # fmt: skip
    setup.extra.append(second)
    second.wait_ready()
    first = setup.gateway
    apply(setup.cluster, waking_pool("summed", activation_timeout_seconds=60), setup.quiet)
    for gateway in (first, second):

        def knows_summed(g: GatewayProcess = gateway) -> bool:
            return "summed" in g.models()

        wait_for(knows_summed, timeout=30, message="pool summed known")

    def lease() -> dict[str, Any]:
        return get_json(setup.cluster, LEASES, demand_lease_name("summed"), "-n", setup.quiet)

    def held_now() -> int | None:
        demand = read_demand(lease())
        return demand.held_at(datetime.now(UTC)) if demand is not None else None

    def shares() -> list[str]:
        return sorted(a for a in lease()["metadata"].get("annotations") or {} if a.startswith(SHARE_PREFIX))

    watcher = LeaseWatch(setup.cluster, setup.quiet, "summed").start()
    long, short = Background(), Background()
    try:
        for i in range(3):  # held on the first gateway for 14 s, on the second for 5 s
            long.send(i, lambda: _post(first, "summed", timeout_header=14))
        for i in range(2):
            short.send(i, lambda: _post(second, "summed", timeout_header=5))
        wait_for(lambda: setup.held("summed", first, setup.quiet) == 3, timeout=10, message="three held")
        wait_for(lambda: setup.held("summed", second, setup.quiet) == 2, timeout=10, message="two held")
        wait_for(lambda: held_now() == 5, timeout=5, message="the Lease shows both replicas' shares: 5 held")
        assert shares() == sorted(share_annotation(_holder(g)) for g in (first, second))

        # The second's holds end (its clients give up): its share stops counting within the lease duration.
        assert [r.status_code for r in short.join(30).values()] == [503, 503]
        ended = time.monotonic()
        assert setup.held("summed", second, setup.quiet) == 0
        wait_for(lambda: held_now() == 3, timeout=2 + 1.5, message="the second replica's share expired")
        assert time.monotonic() - ended <= 2 + 1.5
        wait_for(
            lambda: shares() == [share_annotation(_holder(first))],
            timeout=5,
            message="the first replica's next write pruned the second's share",
        )
        assert held_now() == 3
        assert [r.status_code for r in long.join(30).values()] == [503] * 3
        final = demand_from_lease(lease())
        wait_for(lambda: watcher.values[-1][0] == final, timeout=10, message="the watch saw the last write")
    finally:
        watcher.stop()
    # One write per interval per replica while it holds requests, never one per request: the gaps between
    # one replica's own writes are an interval or more (another's write postpones none of them).
    by_holder: dict[str, list[datetime]] = {}
    for at, holder in watcher.values:
        by_holder.setdefault(holder, []).append(at)
    assert set(by_holder) == {_holder(first), _holder(second)}, watcher.values
    for holder, times in by_holder.items():
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        assert all(gap >= 0.9 for gap in gaps), (holder, gaps)
    assert 3 <= len(by_holder[_holder(second)]) <= 5 + 1, watcher.values
    assert 10 <= len(by_holder[_holder(first)]) <= 14 + 1, watcher.values
    # Every write the gateways counted is one of the changes seen (renewTime has microseconds).
    writes = [
        g.metric("modelpool_gateway_demand_writes_total", pool=f"{setup.quiet}/summed", result="ok")
        for g in (first, second)
    ]
    assert sum(writes) == len(watcher.values), (writes, watcher.values)
    assert not any(
        g.metric("modelpool_gateway_demand_writes_total", pool=f"{setup.quiet}/summed", result="error")
        for g in (first, second)
    )
