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
"""

from __future__ import annotations

from testkit.echo_models import ECHO, GENERATION
from testkit.services import (  # shared with the soak, the demo and the operator tests (re-exported)
    GatewayProcess,
    bearer,
    create_key,
    echo_pool,
    worker_pids,
)

__all__ = ["ECHO", "GENERATION", "GatewayProcess", "bearer", "create_key", "echo_pool", "worker_pids"]
