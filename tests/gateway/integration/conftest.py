"""Fixtures of the gateway integration tests: the operator's (CRDs, operator processes, the budget, pod
watchers, the budget + pod watcher + operator set-up), and gateway processes that are stopped at teardown
(SIGTERM; a clean exit is part of the contract)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.services import stop_all
from tests.gateway.integration.gwharness import GatewayProcess
from tests.operator.integration.conftest import (  # noqa: F401 - fixtures and the report hook, shared
    budget,
    budgeted_operator,
    crds,
    pytest_runtest_makereport,
    start_operator,
    watch_pods,
)

StartGateway = Callable[..., GatewayProcess]


@pytest.fixture
def start_gateway(
    crds: Cluster,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[StartGateway]:
    """A factory: ``start_gateway(namespaces, *flags, ready=True, kubeconfig=None, env=None)`` -> a gateway
    process (ready unless ``ready=False``)."""
    started: list[GatewayProcess] = []

    def start(
        namespaces: list[str],
        *flags: str,
        ready: bool = True,
        kubeconfig: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> GatewayProcess:
        log = tmp_path / f"gateway-{len(started)}.log"
        gateway = GatewayProcess(crds, namespaces, log, *flags, kubeconfig=kubeconfig, env=env)
        started.append(gateway)
        if ready:
            gateway.wait_ready()
        return gateway

    yield start
    failed = bool(getattr(request.node, "rep_call", None) and request.node.rep_call.failed)
    stop_all(started, show_logs=failed, what="gateway")
