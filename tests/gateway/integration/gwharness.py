"""Harness of the gateway integration tests: the real ``modelpool-gateway`` process and echo pools.

* ``GatewayProcess`` (from ``testkit.services``): ``.venv/bin/modelpool-gateway`` (the console script)
  with the cluster's kubeconfig
  (or a ``kubeconfig`` given, e.g. a ServiceAccount's) and ``env`` added to the test's environment, on a
  loopback port of its own; ``stop()`` sends SIGTERM and returns the exit code, ``kill()`` SIGKILLs.
  Unless started with ``--auth none`` or a keys namespace of the test's own (``--keys-namespace`` or
  ``MODELPOOL_GATEWAY_KEYS_NAMESPACE``), it gets an admin
  namespace of its own holding one key Secret that grants every namespace: ``.key``, and ``.headers``
  (``Authorization: Bearer``) for the test's requests.
* ``create_key``: a key Secret (label ``modelpool.dev/gateway-key``), as an administrator creates one.
* ``echo_pool``: a ModelPool whose workers run on the process node as real ``modelpool-server`` processes
  with a test handler (``testkit/echo_models.py``): echo embeddings or echo generation, fast to load;
  autoscaling off unless asked for.
* ``serving_stack``: the set-up most gateway tests share (a namespace of their own, the operator, a gateway,
  pools applied and serving through it), torn down with clean exits asserted.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.cluster import Cluster
from testkit.echo_models import ECHO, GENERATION
from testkit.environment import free_port
from testkit.kubectl import apply, wait_for
from testkit.services import (  # shared with the soak, the demo and the operator tests (re-exported)
    GatewayProcess,
    bearer,
    create_key,
    echo_pool,
    worker_pids,
)
from tests.operator.integration.opharness import POOLS, OperatorProcess


@dataclass
class ServingStack:
    """What ``serving_stack`` started."""

    namespace: str
    operator: OperatorProcess
    gateway: GatewayProcess


@contextmanager
def serving_stack(
    cluster: Cluster,
    prefix: str,
    logs: Path,
    pools: Sequence[tuple[dict[str, Any], int]],
    *gateway_flags: str,
    log_format: str = "plain",
    worker_port: int | None = None,
) -> Iterator[ServingStack]:
    """A namespace ``<prefix>-<random>``, an operator and a gateway for it (logs in ``logs``), and each
    ``(manifest, workers)`` of ``pools`` applied there and serving that many workers through the gateway.
    On exit the pools are deleted while the operator runs (it removes its finalizers), both processes
    stopped (each must exit 0) and the namespace deleted.  ``log_format``: the operator's (and its
    workers'); ``worker_port``: the port its workers serve on (a free one by default)."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", namespace)
    port = worker_port or free_port()
    operator = OperatorProcess(
        cluster, [namespace], logs / "operator.log", log_format=log_format,
        MODELPOOL_OPERATOR_SERVER_PORT=str(port),
    )  # fmt: skip
    try:
        gateway = GatewayProcess(cluster, [namespace], logs / "gateway.log", *gateway_flags)
    except BaseException:
        operator.stop()  # the gateway could not start: the operator must not outlive the test
        raise
    try:
        account = ("get", "sa", "default", "-n", namespace)
        wait_for(lambda: cluster.kubectl(*account, check=False).returncode == 0, timeout=30,
                 message="default ServiceAccount")  # fmt: skip
        for manifest, _ in pools:
            apply(cluster, manifest, namespace)
        gateway.wait_ready()
        for manifest, workers in pools:
            gateway.wait_serving(manifest["metadata"]["name"], workers)
        yield ServingStack(namespace, operator, gateway)
    finally:
        cluster.kubectl("delete", POOLS, "--all", "-n", namespace, "--timeout=60s", check=False)
        codes = (gateway.stop(), operator.stop())
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        assert codes == (0, 0), f"exit codes (gateway, operator): {codes}\n{gateway.log_tail()}"


__all__ = [
    "ECHO",
    "GENERATION",
    "GatewayProcess",
    "ServingStack",
    "bearer",
    "create_key",
    "echo_pool",
    "serving_stack",
    "worker_pids",
]
