"""What the gateway benchmarks start on a local control plane (``bench.gateway``, ``bench.fairness``): the
CRDs, the bench's namespace, the real operator as a process (``--standalone``, watching that namespace,
its workers on the process node), API key Secrets, and the processes' stop.

One definition, so that the benchmarks start the operator alike (the test nodes' and handlers' policy
from ``testkit.services``) and a change of its flags reaches every one of them.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from bench.kwok import wait
from modelpool_contract.gateway_keys import KEY_FIELD, KEY_LABEL_VALUE, LABEL_GATEWAY_KEY
from testkit.environment import ROOT, free_port
from testkit.kubectl import kubectl
from testkit.services import POLICY_ENV

OPERATOR = ROOT / ".venv" / "bin" / "modelpool-operator"


def install_crds(kubeconfig: Path) -> None:
    """The project's CRDs, applied and established."""
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    wait(
        lambda: "Established" in kubectl(kubeconfig, "get", "crd", "modelpools.modelpool.dev", "-o",
                                         "jsonpath={.status.conditions[*].type}"),
        60, "the ModelPool CRD established",
    )  # fmt: skip


def start_operator(
    kubeconfig: Path,
    namespace: str,
    log: Path,
    procs: list[subprocess.Popen[bytes]],
    env: dict[str, str] | None = None,
) -> int:
    """The CRDs, ``namespace`` and the operator watching it (its output in ``log``; ``procs`` gets the
    process, which the caller stops); the port its workers serve on.  ``env`` adds operator settings."""
    install_crds(kubeconfig)
    kubectl(kubeconfig, "create", "namespace", namespace)
    worker_port = free_port()
    full = dict(os.environ, KUBECONFIG=str(kubeconfig), MODELPOOL_OPERATOR_SERVER_PORT=str(worker_port))
    full.update(POLICY_ENV)  # the test nodes and handlers, beyond the default allowlists
    full.update(env or {})
    procs.append(
        subprocess.Popen(
            # No fixed ports: another benchmark's or test's operator may be running on this machine.
            [str(OPERATOR), "--namespace", namespace, "--standalone", "--liveness", "0", "--metrics", "0"],
            env=full, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
    )  # fmt: skip
    return worker_port


def key_secret(name: str, namespace: str, key: str, **fields: str) -> dict[str, Any]:
    """An API key Secret (``modelpool_contract.gateway_keys``) holding ``key`` and the data ``fields``
    (``namespaces``, ``requestsPerMinute``, ...)."""
    data = {KEY_FIELD: key, **fields}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {LABEL_GATEWAY_KEY: KEY_LABEL_VALUE}},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process, the last started first; killed after 30 s."""
    for proc in reversed(procs):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


__all__ = ["OPERATOR", "install_crds", "key_secret", "start_operator", "stop"]
