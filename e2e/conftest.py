"""Fixtures of the e2e suite: which cluster the tests talk to.

* ``MODELPOOL_E2E_CLUSTER=external`` (set by e2e/kind.sh): the cluster in ``KUBECONFIG`` (kind), as is.
* Otherwise the local control plane: the session's ``cluster`` fixture (tests/conftest.py) when it is
  visible from here (a repository-root conftest), so the whole suite shares one control plane; failing
  that, e2e starts its own through the same ``hack/cluster.sh up`` (own directory, name and pod address
  range), torn down at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.helpers import BIN, ROOT, missing

CLUSTER_BINARIES = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwokctl",
]


@pytest.fixture(scope="session")
def e2e_external() -> bool:
    """True when the tests run against an external cluster (kind), not the local control plane."""
    return os.environ.get("MODELPOOL_E2E_CLUSTER", "") == "external"


def _own_cluster(request: pytest.FixtureRequest) -> Iterator[Path]:
    absent = [b for b in CLUSTER_BINARIES if not (BIN / b).exists()]
    if absent:
        missing(f"control-plane binaries missing in {BIN}: {', '.join(absent)} (run: make testbin)")
    workdir = Path(tempfile.mkdtemp(prefix="modelpool-e2e-cluster-"))
    env = dict(
        os.environ,
        CLUSTER_DIR=str(workdir),
        CLUSTER_NAME=f"mp-e2e-{uuid.uuid4().hex[:6]}",
        BIN_DIR=str(BIN),
        # Neither tests/conftest.py's range (100 + pid % 150) nor the default 42 (make demo, make cluster-up).
        PROCESSNODE_IP_OCTET=str(20 + os.getpid() % 20),
    )
    script = ["bash", str(ROOT / "hack" / "cluster.sh")]
    # Output to a file, not a pipe: the background processes `up` starts keep its stdout open.
    log = workdir / "cluster.sh.log"

    def cluster_sh(action: str, timeout: float) -> int:
        with log.open("a") as out:
            return subprocess.run(
                [*script, action], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode

    started = False
    try:
        if cluster_sh("up", 300) != 0:
            pytest.fail(f"hack/cluster.sh up failed (logs in {workdir}):\n{log.read_text()[-4000:]}")
        started = True
        yield workdir / "kubeconfig"
    finally:
        cluster_sh("down", 120)
        if request.session.testsfailed or not started:
            print(f"\n[e2e] tests failed: cluster logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def e2e_kubeconfig(request: pytest.FixtureRequest, e2e_external: bool) -> Iterator[Path]:
    """The kubeconfig of the cluster under test."""
    if e2e_external:
        path = os.environ.get("KUBECONFIG", "")
        if not path or not Path(path).exists():
            pytest.fail("MODELPOOL_E2E_CLUSTER=external needs KUBECONFIG pointing at the cluster")
        yield Path(path)
        return
    try:
        shared = request.getfixturevalue("cluster")
    except pytest.FixtureLookupError:
        yield from _own_cluster(request)
        return
    yield Path(shared.kubeconfig)
