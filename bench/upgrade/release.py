"""The two releases of the upgrade check: the previous one (0.2.0, commit ``PREVIOUS_COMMIT``: its chart
and its operator and gateway code) and the current tree, installed by the real helm on the local control
plane, and what a Service would do for the clients (the gateway pods that are Ready now).

How the previous code runs: the process node runs a pod's ``command`` as a local process (no image is
pulled; ``testkit/processnode``), so the old release's values set the operator's and the gateway's
``command`` to ``env PYTHONPATH=<old tree>/operator:<old tree> <venv>/bin/modelpool-operator`` (and
``modelpool-gateway``): the console scripts of this virtualenv, importing the old tree's packages first
(the editable install's finder comes after ``PYTHONPATH``). The images are not rebuilt for 0.2.0. The
workers (real ``modelpool-server`` processes with the echo handler) run this tree's server code under both
releases: the process node has no image to tell the two servers apart, so "the new server" is judged as a
cluster would show it: every worker made by the new operator, with the new release's server image.

``values`` and ``gateway_endpoints`` are pure (unit-tested); the rest runs git and helm.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelpool_contract.reserved import DEFAULT_NODE_SELECTOR_KEYS, DEFAULT_TOLERATION_KEYS
from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import PROCESS_NODE_SELECTOR, PROCESS_NODE_TOLERATION, is_ready

#: The previous release: "CHANGELOG: what 0.2.0 holds, as built".
PREVIOUS_COMMIT = "4adeea3"
CHART = "charts/modelpool-operator"
RELEASE = "mp-upgrade"
#: The release namespace: the audit policy (hack/audit-policy.yaml) records its ServiceAccounts' requests.
SYSTEM_NAMESPACE = "modelpool-audit"
KEYS_NAMESPACE = f"{SYSTEM_NAMESPACE}-keys"
POOLS_NAMESPACE = "mp-upgrade-pools"
BUDGET = "upgrade"
VENV_BIN = ROOT / ".venv" / "bin"
GATEWAY_LABEL = "app.kubernetes.io/component=gateway"
HELM_TIMEOUT_S = 300


@dataclass(frozen=True)
class Ports:
    """This machine's ports the releases' processes take (the process node's pods share them)."""

    liveness: int
    metrics: int
    gateway: int
    gateway_metrics: int
    server: int
    server_probe: int


def values(*, ports: Ports, budget_memory: str, old_tree: Path | None) -> dict[str, Any]:
    """The chart values: ``old_tree`` set, the previous release's (its code on ``PYTHONPATH``, its chart's
    keys only); None, the current tree's with what docs/install.md "Upgrading" says the 0.2.0 -> now
    upgrade needs (one replica and ``Recreate`` for that one upgrade, the keys namespace made and filled
    beforehand, the allowlists for what the pools ask)."""
    on_node = {"nodeSelector": dict(PROCESS_NODE_SELECTOR), "tolerations": [dict(PROCESS_NODE_TOLERATION)]}

    def command(script: str) -> list[str]:
        if old_tree is None:
            return [str(VENV_BIN / script)]
        return ["env", f"PYTHONPATH={old_tree / 'operator'}:{old_tree}", str(VENV_BIN / script)]

    out: dict[str, Any] = {
        "scope": {"clusterWide": False, "namespaces": [POOLS_NAMESPACE]},
        "replicaCount": 1,
        "command": command("modelpool-operator"),
        "liveness": {"port": ports.liveness},
        "metrics": {"port": ports.metrics},
        "config": {
            "budgetName": BUDGET,
            "serverPort": ports.server,
            "serverProbePort": ports.server_probe,
            "statsIntervalSeconds": 1,
            "resyncIntervalSeconds": 2,
            "backoffBaseSeconds": 1,
            "logFormat": "plain",
        },
        "budget": {"create": True, "memory": budget_memory},
        **on_node,
        "gateway": {
            **on_node,
            "replicaCount": 2,
            "command": command("modelpool-gateway"),
            # Pods on the process node share the machine's ports: each gateway listens on its pod address.
            "port": ports.gateway,
            "extraEnv": [
                {"name": "MODELPOOL_GATEWAY_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
            ],
        },
    }
    if old_tree is not None:
        return out
    out["updateStrategy"] = {"type": "Recreate", "rollingUpdate": None}
    out["config"].update(
        {
            "allowedNodeSelectorKeys": [*DEFAULT_NODE_SELECTOR_KEYS, *PROCESS_NODE_SELECTOR],
            "allowedTolerationKeys": [*DEFAULT_TOLERATION_KEYS, PROCESS_NODE_TOLERATION["key"]],
            # The echo handler the workers import from the checkout (testkit.services.echo_pool).
            "allowedEnvNames": ["MODELPOOL_HANDLER", "PYTHONPATH"],
        }
    )
    out["gateway"]["metrics"] = {"port": ports.gateway_metrics}
    out["gateway"]["auth"] = {"keysNamespace": KEYS_NAMESPACE, "createKeysNamespace": False}
    return out


#: Where the previous release's files are unpacked (once): not under /tmp, which the process node maps to
#: each container's private /tmp in its paths (a PYTHONPATH there would name the container's own folder).
PREVIOUS_DIR = Path.home() / ".cache" / "modelpool" / f"release-{PREVIOUS_COMMIT}"


def previous_tree(into: Path = PREVIOUS_DIR) -> Path:
    """The previous release's files (``git archive`` of ``PREVIOUS_COMMIT``) under ``into``, unpacked
    once (a marker file says the unpacking completed)."""
    done = into / ".unpacked"
    if done.exists():
        return into
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    with tempfile.TemporaryFile() as archive:
        subprocess.run(["git", "archive", PREVIOUS_COMMIT], cwd=ROOT, stdout=archive, check=True)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(into, filter="data")
    done.touch()
    return into


def helm(cluster: Cluster, verb: str, tree: Path, chart_values: dict[str, Any], workdir: Path) -> float:
    """``helm install|upgrade`` the chart of ``tree`` with ``chart_values``, ``--wait``; its seconds."""
    path = workdir / f"values-{verb}.yaml"
    path.write_text(yaml.safe_dump(chart_values))
    started = time.monotonic()
    cluster.helm(
        verb, RELEASE, str(tree / CHART),
        "--namespace", SYSTEM_NAMESPACE, "--values", str(path), "--take-ownership",
        "--wait", "--timeout", f"{HELM_TIMEOUT_S}s",
        timeout=HELM_TIMEOUT_S + 30,
    )  # fmt: skip
    return time.monotonic() - started


def gateway_endpoints(pods: list[dict[str, Any]], port: int) -> list[str]:
    """What the gateway Service's endpoints are, from its pods: the Ready, not terminating ones' addresses."""
    return [
        f"http://{p['status']['podIP']}:{port}"
        for p in pods
        if is_ready(p) and not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("podIP")
    ]
