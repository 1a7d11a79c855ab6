"""Root fixtures: one local control plane for the whole pytest session, and a namespace per test.

`cluster` starts the control plane through `hack/cluster.sh up` (the same code path as `make cluster-up`)
in a fresh temporary directory with its own cluster name, ports and pod address range, so it never
touches a developer's `.cluster/`; it is torn down at the end of the session, and its logs are kept (and
their location printed) when any test failed.  Set MODELPOOL_TEST_KUBECONFIG to reuse a running cluster
instead (e.g. `make cluster-up` then MODELPOOL_TEST_KUBECONFIG=.cluster/kubeconfig); its process node is
then taken from MODELPOOL_TEST_PROCESS_NODE (default process-node-0) with container logs in
MODELPOOL_TEST_PROCESSNODE_LOG_DIR (default .cluster/processnode).

Missing binaries (`make testbin`) skip cluster tests locally and fail them in CI (CI=true).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kube import wait_for

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


@dataclass
class Cluster:
    """A running local control plane."""

    kubeconfig: Path
    bin_dir: Path
    log_dir: Path
    process_node: str
    processnode_log_dir: Path

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


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing prerequisite is a failure)", pytrace=False)
    pytest.skip(reason)


def _start_cluster(workdir: Path, name: str) -> Cluster:
    env = dict(
        os.environ,
        CLUSTER_DIR=str(workdir),
        CLUSTER_NAME=name,
        BIN_DIR=str(BIN),
        # A distinct pod address range per session, so concurrent sessions never share an address.
        PROCESSNODE_IP_OCTET=str(100 + os.getpid() % 150),
    )
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "cluster.sh"), "up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"hack/cluster.sh up failed; logs kept in {workdir}:\n{done.stdout}\n{done.stderr}"
        )
    return Cluster(
        kubeconfig=workdir / "kubeconfig",
        bin_dir=BIN,
        log_dir=workdir / "logs",
        process_node="process-node-0",
        processnode_log_dir=workdir / "processnode",
    )


def _stop_cluster(workdir: Path, name: str) -> None:
    env = dict(os.environ, CLUSTER_DIR=str(workdir), CLUSTER_NAME=name, BIN_DIR=str(BIN))
    subprocess.run(
        ["bash", str(ROOT / "hack" / "cluster.sh"), "down"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    reuse = os.environ.get("MODELPOOL_TEST_KUBECONFIG")
    if reuse:
        kubeconfig = Path(reuse).resolve()
        if not kubeconfig.exists():
            _missing(f"MODELPOOL_TEST_KUBECONFIG={reuse} does not exist")
        yield Cluster(
            kubeconfig=kubeconfig,
            bin_dir=BIN,
            log_dir=kubeconfig.parent / "logs",
            process_node=os.environ.get("MODELPOOL_TEST_PROCESS_NODE", "process-node-0"),
            processnode_log_dir=Path(
                os.environ.get("MODELPOOL_TEST_PROCESSNODE_LOG_DIR", kubeconfig.parent / "processnode")
            ),
        )
        return
    missing = [b for b in REQUIRED if not (BIN / b).exists()]
    if missing:
        _missing(f"control-plane binaries missing in {BIN}: {', '.join(missing)} (run: make testbin)")
    if not (ROOT / ".venv" / "bin" / "python").exists():
        _missing("no .venv (run: make venv)")
    workdir = Path(tempfile.mkdtemp(prefix="modelpool-cluster-"))
    name = f"mp-test-{uuid.uuid4().hex[:6]}"
    try:
        c = _start_cluster(workdir, name)
    except BaseException:
        _stop_cluster(workdir, name)
        raise
    try:
        yield c
    finally:
        _stop_cluster(workdir, name)
        if request.session.testsfailed:
            sys.stderr.write(
                f"\n[cluster] tests failed: control-plane and process-node logs kept in {workdir}\n"
            )
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting for its pods to go)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the controller-manager has created the namespace's default ServiceAccount.
    wait_for(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=30,
        message=f"default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
