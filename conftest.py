"""Root fixtures (tests/ and e2e/ share them): one local control plane for the whole pytest session, and a
namespace per test.

`cluster` starts the control plane through `hack/cluster.sh up` (the same code path as `make cluster-up`)
in a fresh temporary directory with its own cluster name, ports and pod address range, so it never
touches a developer's `.cluster/`; it is torn down at the end of the session, and its logs are kept (and
their location printed) when any test failed.  Set MODELPOOL_TEST_KUBECONFIG to reuse a running cluster
instead (e.g. `make cluster-up` then MODELPOOL_TEST_KUBECONFIG=.cluster/kubeconfig); its process node is
then taken from MODELPOOL_TEST_PROCESS_NODE (default process-node-0) with container logs in
MODELPOOL_TEST_PROCESSNODE_LOG_DIR (default .cluster/processnode).

Missing binaries (`make testbin`) skip cluster tests locally and fail them in CI (CI=true).

The cluster is guarded for the whole session (testkit/loopback.py): every pod IP it assigns is recorded,
and teardown fails the run, naming the pods, if any lies outside 127.0.0.0/8, since tests may send traffic
to loopback addresses only.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from testkit.cluster import (
    Cluster,
    missing,
    require_prerequisites,
    reused_cluster,
    start_cluster,
    stop_cluster,
)
from testkit.kubectl import wait_for
from testkit.loopback import PodIPWatch

# No per-example deadline: what a property test checks is the answer, never its speed (speed is checked by
# the benchmarks); Hypothesis's default 200 ms failed a pure test on this loaded 2-core machine (287 ms).
settings.register_profile("modelpool", deadline=None)
settings.load_profile("modelpool")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    reuse = os.environ.get("MODELPOOL_TEST_KUBECONFIG")
    if reuse:
        kubeconfig = Path(reuse).resolve()
        if not kubeconfig.exists():
            missing(f"MODELPOOL_TEST_KUBECONFIG={reuse} does not exist")
        log_dir = os.environ.get("MODELPOOL_TEST_PROCESSNODE_LOG_DIR")
        yield from _guarded(
            reused_cluster(
                kubeconfig,
                process_node=os.environ.get("MODELPOOL_TEST_PROCESS_NODE", "process-node-0"),
                processnode_log_dir=Path(log_dir) if log_dir else None,
            )
        )
        return
    require_prerequisites()
    workdir = Path(tempfile.mkdtemp(prefix="modelpool-cluster-"))
    name = f"mp-test-{uuid.uuid4().hex[:6]}"
    try:
        c = start_cluster(workdir, name)
    except BaseException:
        stop_cluster(workdir, name)
        raise
    try:
        yield from _guarded(c)
    finally:
        stop_cluster(workdir, name)
        if request.session.testsfailed:
            sys.stderr.write(
                f"\n[cluster] tests failed: control-plane and process-node logs kept in {workdir}\n"
            )
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _guarded(c: Cluster) -> Iterator[Cluster]:
    """Yield the cluster with its pod IP guard running; afterwards fail if any pod IP was not loopback."""
    c.pod_ips = PodIPWatch(c.kubeconfig)
    c.pod_ips.start()
    yield c
    c.pod_ips.stop()
    c.pod_ips.raise_for_violations()


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


@pytest.fixture
def persistent_volumes(cluster: Cluster) -> Iterator[list[str]]:
    """Names of the (cluster-scoped) PersistentVolumes a test creates, deleted afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        cluster.kubectl("delete", "pv", name, "--wait=false", check=False)
