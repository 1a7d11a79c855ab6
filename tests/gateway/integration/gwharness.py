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
  with a test handler (``tests/server/handlers.py``): echo embeddings or echo generation, fast to load;
  autoscaling off unless asked for.
"""

from __future__ import annotations

from typing import Any

from testkit.environment import ROOT
from testkit.services import (  # shared with the soak and the demo (re-exported)
    GROUP_VERSION,
    GatewayProcess,
    bearer,
    create_key,
    worker_pids,
)

__all__ = ["ECHO", "GENERATION", "GatewayProcess", "bearer", "create_key", "echo_pool", "worker_pids"]

PROCESS_NODE = {"modelpool.dev/process-node": "true"}
ECHO = "tests.server.handlers:EchoEmbedding"
GENERATION = "tests.server.handlers:EchoGeneration"


def echo_pool(
    name: str,
    *,
    replicas: int = 1,
    handler: str = ECHO,
    task: str = "text-embedding",
    memory: str = "1Gi",
    env: dict[str, str] | None = None,
    served_model_name: str | None = None,
    activation_timeout_seconds: int | None = None,
    queue_capacity: int = 100,
    autoscaling: dict[str, Any] | None = None,
    min_replicas: int = 0,
    max_replicas: int | None = None,
    idle_timeout_seconds: int = 0,
) -> dict[str, Any]:
    """A pool of real ``modelpool-server`` workers with a test handler, on the process node.

    Without ``autoscaling`` the test chooses the worker count: the operator neither scales it with the load
    nor wakes a pool at zero for demand.  With it (``{}``: the defaults) the operator does both."""
    all_env = {"MODELPOOL_HANDLER": handler, "PYTHONPATH": str(ROOT), **(env or {})}
    spec: dict[str, Any] = {
        "model": {"source": "/", "task": task},
        "replicas": replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max(replicas, 4) if max_replicas is None else max_replicas,
        "resources": {"memory": memory, "gpus": 0},
        "queue": {"capacity": queue_capacity},
        "idleTimeoutSeconds": idle_timeout_seconds,
        "autoscaling": {"enabled": False} if autoscaling is None else autoscaling,
        "podTemplate": {
            "nodeSelector": PROCESS_NODE,
            "tolerations": [{"key": "modelpool.dev/process-node", "operator": "Exists"}],
            "env": [{"name": k, "value": v} for k, v in all_env.items()],
        },
    }
    if served_model_name:
        spec["servedModelName"] = served_model_name
    if activation_timeout_seconds is not None:
        spec["activationTimeoutSeconds"] = activation_timeout_seconds
    return {"apiVersion": GROUP_VERSION, "kind": "ModelPool", "metadata": {"name": name}, "spec": spec}
