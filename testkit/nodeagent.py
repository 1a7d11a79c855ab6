"""A second process node agent (``python -m testkit.processnode``) beside the session's process-node-0,
started and stopped by a test or a bench: its own work directory (logs, pods), its log, its process.

``testkit.imagenode.ImageNode`` is one in image mode; the upgrade check's drain (``bench/upgrade``) runs
one in process mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import wait_for

#: How long a started agent has to renew its node Lease and show its node Ready.
READY_TIMEOUT_S = 90


class NodeAgent:
    """A process node agent named ``name`` (its node's name too), its pods at 127.<ip_octet>.x.y; ``args``:
    its mode's flags; ``workdir``: where its logs and pods go (default: beside process-node-0's)."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        ip_octet: int,
        *,
        args: Sequence[str] = (),
        workdir: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.octet = ip_octet
        self.args = tuple(args)
        self.workdir = workdir if workdir is not None else cluster.processnode_log_dir.parent / name
        self.log = self.workdir / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        w = self.workdir
        return [
            sys.executable,
            "-m",
            "testkit.processnode",
            *("--kubeconfig", str(self.cluster.kubeconfig), "--node-name", self.name),
            *("--log-dir", str(w / "logs"), "--pods-dir", str(w / "pods"), "--ip-octet", str(self.octet)),
            *("--backoff-initial", "1", "--backoff-max", "30"),
            *self.args,
        ]

    def start(self) -> None:
        """Start the agent and wait until its node is Ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        since = time.time()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=ROOT,
                env=dict(os.environ, HF_HUB_OFFLINE="1"),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(
            lambda: self._up(since),
            timeout=READY_TIMEOUT_S,
            interval=0.5,
            message=f"node {self.name} up (log {self.log})",
        )

    def _up(self, since: float) -> bool:
        """This agent's Lease renewed (not one of an earlier agent of the name) and its node Ready; an agent
        that exited fails the wait with its log's tail."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"node agent {self.name} exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            )
        jsonpath = "jsonpath={.spec.renewTime}"
        done = self.cluster.kubectl(
            "get", "lease", "-n", "kube-node-lease", self.name, "-o", jsonpath, check=False
        )
        if done.returncode != 0 or not done.stdout.strip():
            return False
        renew = datetime.fromisoformat(done.stdout.strip().replace("Z", "+00:00"))
        if renew.timestamp() < since - 1:
            return False  # a lease of an earlier agent
        ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
        return (
            self.cluster.kubectl("get", "node", self.name, "-o", ready, check=False).stdout.strip() == "True"
        )

    def stop(self) -> None:
        """SIGTERM: the agent stops its pods' processes and leaves."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL: the agent dies without stopping anything (its pods' processes keep running)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
