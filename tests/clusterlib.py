"""The local control plane as the tests see it: the `Cluster` handle and starting/stopping one through
`hack/cluster.sh` (the same code path as `make cluster-up`).  The fixtures live in the root conftest.py."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from hack.loopback_guard import PodIPWatch

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("MODELPOOL_TEST_BIN_DIR", ROOT / "bin"))
REQUIRED = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwokctl",
]
IN_CI = os.environ.get("CI", "").lower() == "true"
CLUSTER_SH_LOG = "cluster.sh.log"


@dataclass
class Cluster:
    """A running local control plane."""

    kubeconfig: Path
    bin_dir: Path
    log_dir: Path
    process_node: str
    processnode_log_dir: Path
    # Records every pod IP the cluster assigns (hack/loopback_guard.py); set by the session fixture.
    pod_ips: PodIPWatch | None = None
    # The API server's audit log (hack/audit-policy.yaml: requests of the modelpool-audit namespace's
    # ServiceAccounts only); None when unknown (a reused cluster without it).
    audit_log: Path | None = None

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run bin/kubectl against this cluster; with check, a non-zero exit raises with its stderr."""
        return self._run("kubectl", args, check=check, input=input, timeout=timeout)

    def helm(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run bin/helm against this cluster."""
        return self._run("helm", args, check=check, input=input, timeout=timeout)

    def _run(
        self, tool: str, args: tuple[str, ...], *, check: bool, input: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / tool), "--kubeconfig", str(self.kubeconfig), *args]
        done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(
                f"{tool} {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}"
            )
        return done


def missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing prerequisite is a failure)", pytrace=False)
    pytest.skip(reason)


def require_prerequisites() -> None:
    """Skip (fail in CI) unless the control-plane binaries and the virtualenv the process node runs exist."""
    absent = [b for b in REQUIRED if not (BIN / b).exists()]
    if absent:
        missing(f"control-plane binaries missing in {BIN}: {', '.join(absent)} (run: make testbin)")
    if not (ROOT / ".venv" / "bin" / "python").exists():
        missing("no .venv (run: make venv)")


def start_cluster(workdir: Path, name: str, ip_octet: int | None = None) -> Cluster:
    """`hack/cluster.sh up` in `workdir` (a cluster of that name there is started again, not created)."""
    env = dict(
        os.environ,
        CLUSTER_DIR=str(workdir),
        CLUSTER_NAME=name,
        BIN_DIR=str(BIN),
        # A distinct pod address range per session, so concurrent sessions never share an address.
        PROCESSNODE_IP_OCTET=str(100 + os.getpid() % 150 if ip_octet is None else ip_octet),
    )
    code = _cluster_sh("up", env, workdir, timeout=300)
    if code != 0:
        log = (workdir / CLUSTER_SH_LOG).read_text()[-4000:]
        raise RuntimeError(f"hack/cluster.sh up failed; logs kept in {workdir}:\n{log}")
    return Cluster(
        kubeconfig=workdir / "kubeconfig",
        bin_dir=BIN,
        log_dir=workdir / "logs",
        process_node="process-node-0",
        processnode_log_dir=workdir / "processnode",
        audit_log=workdir / "kwok" / "clusters" / name / "logs" / "audit.log",
    )


def stop_cluster(workdir: Path, name: str) -> None:
    env = dict(os.environ, CLUSTER_DIR=str(workdir), CLUSTER_NAME=name, BIN_DIR=str(BIN))
    _cluster_sh("down", env, workdir, timeout=120)


def _cluster_sh(action: str, env: dict[str, str], workdir: Path, timeout: float) -> int:
    """Run hack/cluster.sh with its output in a file: never a pipe, which the background processes that
    `up` starts would keep open (the call would then never return)."""
    with (workdir / CLUSTER_SH_LOG).open("a") as out:
        return subprocess.run(
            ["bash", str(ROOT / "hack" / "cluster.sh"), action],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        ).returncode
