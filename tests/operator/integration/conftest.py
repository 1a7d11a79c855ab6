"""Fixtures of the operator integration tests: CRDs installed, operator processes, the shared budget, pod
watchers, and the budget + pod watcher + operator set-up that the budget tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.environment import ROOT, free_port
from testkit.kubectl import apply, wait_established, wait_for
from testkit.services import stop_all
from tests.operator.integration.opharness import (
    POOLS,
    BudgetedOperator,
    OperatorProcess,
    PodWatcher,
    StartOperator,
    WatchPods,
    budget_manifest,
)


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> Cluster:
    """The ModelPool and ModelBudget CRDs from crds/, established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    wait_established(cluster, "modelpools.modelpool.dev", "modelbudgets.modelpool.dev")
    return cluster


@pytest.fixture
def start_operator(crds: Cluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StartOperator]:
    """A factory: ``start_operator(*namespaces, peering=None, kubeconfig=None, **env)`` (no namespace: the
    whole cluster); every process is stopped (SIGTERM) at teardown and must exit 0; its log is printed when
    the test failed."""
    started: list[OperatorProcess] = []
    # One workers' probe port for every operator of the test: it is part of the pod the operator renders
    # (its template hash), so operators that differed in it would each roll the other's workers, as an
    # upgrade that changes the port does.
    probe_port = str(free_port())

    def start(
        *namespaces: str, peering: str | None = None, kubeconfig: Path | None = None, **env: str
    ) -> OperatorProcess:
        env.setdefault("MODELPOOL_OPERATOR_SERVER_PROBE_PORT", probe_port)
        log = tmp_path / f"operator-{len(started)}.log"
        process = OperatorProcess(crds, namespaces, log, peering=peering, kubeconfig=kubeconfig, **env)
        started.append(process)
        # Ready once its startup hook ran (imports done, API connected): timeouts then measure the operator,
        # not the interpreter's start on a busy machine.
        wait_for(
            lambda: not process.alive() or "modelpool-operator started" in process.log_tail(10**7),
            timeout=120,
            interval=0.3,
            message="the operator started",
        )
        assert process.alive(), f"the operator exited at start:\n{process.log_tail()}"
        return process

    yield start
    failed = bool(getattr(request.node, "rep_call", None) and request.node.rep_call.failed)
    # Delete the pools while an operator still runs, so it removes its finalizer and the test's namespace
    # can go (a pool left with a finalizer and no operator would keep its namespace Terminating).
    live = [p for p in started if p.alive()]
    for namespace in {ns for p in live for ns in p.namespaces}:
        crds.kubectl("delete", POOLS, "--all", "-n", namespace, "--timeout=30s", check=False)
    stop_all(started, show_logs=failed, what="operator")


@pytest.fixture
def budget(crds: Cluster) -> Iterator[Callable[[str], None]]:
    """Set the cluster's ``ModelBudget default`` (it is cluster-scoped: deleted again after the test)."""

    def set_budget(memory: str) -> None:
        apply(crds, budget_manifest(memory))

    yield set_budget
    crds.kubectl("delete", "modelbudget", "default", "--ignore-not-found", "--wait=false")
    # The operator (set up after this fixture) has stopped by now, so nobody removes its budget daemon's
    # finalizer: drop it and see the budget gone, or the next test's apply lands on an object being
    # deleted, which its operator then lets go (no budget, no budget daemon, no budget metrics).
    crds.kubectl(
        "patch", "modelbudget", "default", "--type", "merge", "-p", '{"metadata":{"finalizers":null}}',
        check=False,
    )  # fmt: skip
    crds.kubectl("wait", "--for=delete", "modelbudget/default", "--timeout=30s", check=False)


@pytest.fixture
def watch_pods(crds: Cluster, namespace: str) -> Iterator[WatchPods]:
    """A factory: ``watch_pods()`` starts a ``PodWatcher`` on the test's namespace.  A test may stop it
    itself (to assert on a frozen record); any still running is stopped at teardown, raising its error."""
    watchers: list[PodWatcher] = []

    def watch() -> PodWatcher:
        watcher = PodWatcher(crds, [namespace]).start()
        watchers.append(watcher)
        return watcher

    yield watch
    for watcher in watchers:
        if not watcher.stopped:
            watcher.stop()


@pytest.fixture
def budgeted_operator(
    budget: Callable[[str], None], watch_pods: WatchPods, start_operator: StartOperator, namespace: str
) -> BudgetedOperator:
    """The set-up the budget tests share: ``budgeted_operator(memory, **env)`` sets the ModelBudget, starts
    a pod watcher on the test's namespace (so every admission is seen), then the operator scoped to it;
    returns the watcher and the operator."""

    def set_up(memory: str, **env: str) -> tuple[PodWatcher, OperatorProcess]:
        budget(memory)
        watcher = watch_pods()
        return watcher, start_operator(namespace, **env)

    return set_up


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    # Remember each phase's report on the item, so fixtures can tell whether the test failed.
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
