"""The control plane a cluster benchmark runs on, with every pod address checked to be loopback.

``guarded_cluster`` starts the local control plane under a name of its own (or uses the one
``MODELPOOL_BENCH_KUBECONFIG`` names), watches every pod address (``hack/loopback_guard``) while the
benchmark runs, and stops its cluster afterwards, also when the start itself fails half-way (``up`` may
have left components running).  The guard's verdict is printed before the numbers count: a benchmark
that sent traffic beyond loopback fails instead of reporting.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hack.loopback_guard import PodIPWatch
from tests.clusterlib import start_cluster, stop_cluster

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
