"""The process node agent: a tiny kubelet that runs each pod bound to its node as local processes.

Dev/test tooling, not product code.  Run from the repository root:

    python -m testkit.processnode --kubeconfig .cluster/kubeconfig --node-name process-node-0 \\
        --extra-path .venv/bin --log-dir .cluster/processnode --pods-dir .cluster/pods

It registers the Node (label and taint modelpool.dev/process-node=true, no KWOK annotation), keeps its
Lease fresh, lists and watches the pods bound to it, and hands each to a PodWorker thread.  Each pod gets
its own loopback address 127.<a>.<y>.<z>; its processes see it as POD_IP and in every --bind-env variable,
so every pod can listen on the same port.  Container output goes to <log-dir>/<namespace>/<pod>/<c>.log;
volumes live under <pods-dir>/<pod uid>/ (volumes.py).  Like a kubelet it outlives a restart of the
control plane: every API call is retried with a bounded back-off while its processes keep running.

Image mode (``--run-images``, off by default): a pod whose images are all in the local containers/storage
store runs from them with runc (``images.py``, ``oci.py``; docs/cluster.md "Image mode"); any other pod
runs as host processes as above.  The session's process-node-0 never uses it (the tests run pods from
the checkout there); ``testkit.imagenode`` starts a second node in image mode for the tests that need
images, and ``hack/cluster.sh`` takes PROCESSNODE_RUN_IMAGES=1 (``make demo`` with the images built).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import quote, urlsplit

from testkit.processnode.container import PodContext
from testkit.processnode.images import STORAGE_ROOT, ImageStore
from testkit.processnode.kubeapi import ClusterGuard, Kube, KubeError, pod_path
from testkit.processnode.node import NodeAgent, parse_taint
from testkit.processnode.oci import Runc, state_root, usable
from testkit.processnode.pod import PodWorker, Retry
from testkit.processnode.podspec import SpecError
from testkit.processnode.volumes import VolumeError, remove_pod_dir

JSON = dict[str, Any]
log = logging.getLogger("processnode")

# Passed from the agent's own environment to every process (the rest of the environment is the pod's).
# Passed to containers run from images too: facts of this machine (no model hub to reach).
OFFLINE = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]
INHERITED = ["HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]
HOST_IP = "127.0.0.1"
RESYNC_SECONDS = 30
# Relisting after a failed list or watch: 1 s, doubling to 10 s while the API server stays away.
RELIST_RETRY = (1.0, 10.0)
DEFAULT_TAINT = "modelpool.dev/process-node=true:NoSchedule"


class IpPool:
    """Unique loopback addresses for pods: 127.<prefix>.<y>.<z>, z and y in 1..254."""

    def __init__(self, second_octet: int) -> None:
        self.second = second_octet
        self._used: set[str] = set()
        self._lock = threading.Lock()

    def allocate(self, preferred: str | None = None) -> str:
        with self._lock:
            if preferred and preferred not in self._used and self._ours(preferred):
                self._used.add(preferred)
                return preferred
            for y in range(1, 255):
                for z in range(1, 255):
                    ip = f"127.{self.second}.{y}.{z}"
                    if ip not in self._used:
                        self._used.add(ip)
                        return ip
        raise RuntimeError("no loopback address left for a pod")

    def release(self, ip: str) -> None:
        with self._lock:
            self._used.discard(ip)

    def _ours(self, ip: str) -> bool:
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return addr.version == 4 and ip.startswith(f"127.{self.second}.")


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.kube = Kube(Path(args.kubeconfig))
        self.guard = ClusterGuard(self.kube)
        self.node_name: str = args.node_name
        self.log_dir = Path(args.log_dir).resolve()
        self.pods_dir = Path(args.pods_dir).resolve()
        self.ips = IpPool(args.ip_octet)
        self.workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.base_env = self._base_env()
        self.images: ImageStore | None = None
        self.runc: Runc | None = None
        if args.run_images:
            self.images = ImageStore(root=Path(args.image_store))
            self.runc = Runc(state_root(self.node_name, self.pods_dir), binary=shutil.which("runc") or "runc")

    def remove_stale_containers(self) -> None:
        """Containers left under this node's runc root by an agent that died: delete them (their pods'
        workers start them anew), so none outlives the agent that owned it."""
        if self.runc is not None:
            for cid in self.runc.delete_all():
                log.info("deleted container %s, left by an earlier agent", cid)

    def _image_base_env(self, pod_ip: str) -> dict[str, str]:
        """What every container run from an image gets besides its image's and its pod's variables: the
        pod address (POD_IP and each --bind-env), the in-cluster API (KUBERNETES_SERVICE_HOST/PORT: the
        API server's own loopback address, as the `kubernetes` Service's ClusterIP is not routable
        here) and the offline flags of this machine (no model hub to reach)."""
        api = urlsplit(self.kube.server)
        env = {k: os.environ[k] for k in [*OFFLINE, *self.args.inherit_env] if k in os.environ}
        env["KUBERNETES_SERVICE_HOST"] = api.hostname or HOST_IP
        env["KUBERNETES_SERVICE_PORT"] = str(api.port or 443)
        env["KUBERNETES_SERVICE_PORT_HTTPS"] = env["KUBERNETES_SERVICE_PORT"]
        env["POD_IP"] = pod_ip
        for name in self.args.bind_env:
            env[name] = pod_ip
        return env

    def mint(self, namespace: str, account: str, spec: JSON) -> str:
        """A ServiceAccount token from the TokenRequest API (a projected serviceAccountToken source)."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        path = f"/api/v1/namespaces/{quote(namespace)}/serviceaccounts/{quote(account)}/token"
        try:
            answer = self.kube.request("POST", path, body=body)
        except KubeError as err:
            raise VolumeError("kube-api-access", f"TokenRequest for {namespace}/{account}: {err}") from err
        return str((answer.get("status") or {}).get("token") or "")

    def _base_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in [*INHERITED, *self.args.inherit_env] if k in os.environ}
        extra = [str(Path(p).resolve()) for p in self.args.extra_path]
        env["PATH"] = os.pathsep.join([*extra, os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
        env.setdefault("HF_HUB_OFFLINE", "1")
        env["KUBECONFIG"] = os.environ.get("KUBECONFIG") or str(Path(self.args.kubeconfig).resolve())
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    # -- ConfigMap / Secret lookups for env ---------------------------------------------------------------
    def lookup(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        plural = "configmaps" if kind == "configmap" else "secrets"
        try:
            obj = self.kube.get(f"/api/v1/namespaces/{quote(namespace)}/{plural}/{quote(name)}")
        except KubeError as err:  # e.g. the API server is restarting: the container waits and retries
            raise SpecError(
                "CreateContainerConfigError", f"cannot read {kind} {namespace}/{name}: {err}"
            ) from err
        if obj is None:
            return None
        data: dict[str, str] = obj.get("data") or {}
        return data

    # -- pods -----------------------------------------------------------------------------------------------
    def _context(self, pod: JSON) -> PodContext:
        meta = pod["metadata"]
        preferred = (pod.get("status") or {}).get("podIP")
        pod_ip = self.ips.allocate(preferred)
        base = dict(self.base_env)
        base["POD_IP"] = pod_ip
        for name in self.args.bind_env:
            base[name] = pod_ip
        return PodContext(
            pod=pod,
            pod_ip=pod_ip,
            host_ip=HOST_IP,
            base_env=base,
            termination_log_envs=list(self.args.termination_log_env),
            lookup=self.lookup,
            log_dir=self.log_dir / str(meta["namespace"]) / str(meta["name"]),
            default_cwd=Path.cwd(),
            backoff_initial=self.args.backoff_initial,
            backoff_max=self.args.backoff_max,
            pod_dir=self.pods_dir / str(meta["uid"]),
            get=self.kube.get,
            node_name=self.node_name,
            images=self.images,
            runc=self.runc,
            mint=self.mint if self.images is not None else None,
            image_base_env=self._image_base_env(pod_ip),
        )

    def _worker_done(self, worker: PodWorker) -> None:
        self.ips.release(worker.ctx.pod_ip)
        with self._lock:
            if self.workers.get(worker.uid) is worker:
                del self.workers[worker.uid]

    def observe(self, pod: JSON) -> None:
        """Level-based: whatever the event, make the pod's worker match the pod object."""
        meta = pod["metadata"]
        uid = str(meta["uid"])
        with self._lock:
            worker = self.workers.get(uid)
        if worker is not None:
            worker.update(pod)
            return
        phase = (pod.get("status") or {}).get("phase")
        if meta.get("deletionTimestamp"):
            # No processes here (finished, or from before this agent): the kubelet removes such pods at once.
            self._force_delete(pod)
            return
        if phase in ("Succeeded", "Failed") or self.stop.is_set():
            return
        worker = PodWorker(self.kube, pod, self._context(pod), self._worker_done)
        with self._lock:
            self.workers[uid] = worker
        log.info("pod %s/%s bound here: running it on %s", meta["namespace"], meta["name"], worker.ctx.pod_ip)
        worker.start()

    def forget(self, uid: str) -> None:
        with self._lock:
            worker = self.workers.get(uid)
        if worker is not None:
            worker.gone()

    def _force_delete(self, pod: JSON) -> None:
        meta = pod["metadata"]
        remove_pod_dir(self.pods_dir / str(meta["uid"]))
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            self.kube.request("DELETE", pod_path(meta["namespace"], meta["name"]), body=body)
        except KubeError as err:
            if err.status not in (404, 409):
                log.warning("deleting pod %s/%s failed: %s", meta["namespace"], meta["name"], err)

    def _reconcile(self, pods: list[JSON], first: bool) -> None:
        """Make the workers match a full list of this node's pods."""
        seen = set()
        for pod in pods:
            seen.add(str(pod["metadata"]["uid"]))
            self.observe(pod)
        with self._lock:
            missing = [uid for uid in self.workers if uid not in seen]
        for uid in missing:
            self.forget(uid)
        if first and self.pods_dir.is_dir():
            # Volumes of pods deleted while no agent ran (the kubelet's orphaned pod directories).
            for orphan in self.pods_dir.iterdir():
                if orphan.name not in seen:
                    log.info("removing volumes of pod %s, which is gone", orphan.name)
                    remove_pod_dir(orphan)

    def sync_pods(self) -> None:
        """List + watch the pods bound to this node; relist every RESYNC_SECONDS, and on any error with a
        bounded back-off, forever: the API server may be restarting (the pods keep running meanwhile)."""
        selector = {"fieldSelector": f"spec.nodeName={self.node_name}"}
        retry = Retry(*RELIST_RETRY)
        first = True
        while not self.stop.is_set():
            try:
                if retry.failures and not self.guard.same_cluster():
                    self.stop.set()  # our cluster is gone: its successor's pods are not ours to run
                    return
                listed = self.kube.request("GET", "/api/v1/pods", query=selector)
                self._reconcile(listed.get("items") or [], first)
                first = False
                if retry.succeeded():
                    log.info("pods listed again: watching")
                rv = str(listed["metadata"].get("resourceVersion", ""))
                for event in self.kube.watch(
                    "/api/v1/pods", dict(selector, resourceVersion=rv), RESYNC_SECONDS
                ):
                    if self.stop.is_set():
                        return
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind in ("ADDED", "MODIFIED"):
                        self.observe(obj)
                    elif kind == "DELETED":
                        self.forget(str(obj["metadata"]["uid"]))
                    elif kind == "ERROR":
                        break  # e.g. 410 Gone: relist
            except Exception as err:  # keep the node alive through API hiccups and restarts
                retry.failed(time.monotonic())
                delay = retry.next_at - time.monotonic()
                log.warning("pod watch failed (relisting in %.0fs): %s", delay, err)
                self.stop.wait(delay)

    def shutdown(self) -> None:
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            w.shutdown()
        for w in workers:
            w.join(timeout=10)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m testkit.processnode", description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--node-name", default="process-node-0")
    p.add_argument("--log-dir", default=".cluster/processnode", help="container logs: DIR/<ns>/<pod>/<c>.log")
    p.add_argument("--pods-dir", default=".cluster/pods", help="pod volumes and mount roots: DIR/<pod uid>/")
    p.add_argument("--bind-env", action="append", default=None, help="env var set to the pod IP (repeatable)")
    p.add_argument(
        "--termination-log-env",
        action="append",
        default=None,
        help="env var set to the container's termination-log file (repeatable)",
    )
    p.add_argument(
        "--extra-path", action="append", default=[], help="directory prepended to PATH (repeatable)"
    )
    p.add_argument(
        "--inherit-env", action="append", default=[], help="agent env var passed to pods (repeatable)"
    )
    p.add_argument("--label", action="append", default=[], help="extra node label KEY=VALUE (repeatable)")
    p.add_argument(
        "--taint",
        action="append",
        default=None,
        help=f"node taint KEY[=VALUE]:EFFECT (repeatable; default {DEFAULT_TAINT}; 'none': no taint)",
    )
    p.add_argument("--gpus", default="8", help="nvidia.com/gpu capacity")
    p.add_argument("--cpu", default="16")
    p.add_argument("--memory", default="64Gi")
    p.add_argument("--pods", default="110")
    p.add_argument("--ip-octet", type=int, default=42, help="pods get 127.<ip-octet>.y.z")
    p.add_argument("--backoff-initial", type=float, default=10.0, help="crash-loop back-off start (s)")
    p.add_argument("--backoff-max", type=float, default=300.0, help="crash-loop back-off cap (s)")
    p.add_argument(
        "--exit-after-api-loss", type=float, default=120.0, help="stop when the API is gone this long (s)"
    )
    p.add_argument(
        "--run-images",
        action="store_true",
        help="run a pod whose images are all in the local store from those images, with runc (image mode)",
    )
    p.add_argument(
        "--image-store", default=str(STORAGE_ROOT), help="containers/storage root (vfs) of --run-images"
    )
    p.add_argument("--verbose", "-v", action="store_true")
    args = p.parse_args(argv)
    args.bind_env = args.bind_env or ["MODELPOOL_HOST"]
    args.termination_log_env = args.termination_log_env or ["MODELPOOL_TERMINATION_LOG"]
    taints = args.taint or [DEFAULT_TAINT]
    try:
        args.taints = [parse_taint(t) for t in taints if t != "none"]
    except ValueError as err:
        p.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(threadName)s: %(message)s",
    )
    # urllib3 logs each of its quick reconnect attempts; the agent logs the outcome (with the cause) itself.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    labels = dict(label.split("=", 1) for label in args.label)
    capacity = {
        "cpu": args.cpu,
        "memory": args.memory,
        "pods": args.pods,
        "nvidia.com/gpu": args.gpus,
        "ephemeral-storage": "100Gi",
    }
    if args.run_images and (why := usable()):
        log.error("--run-images: %s", why)
        return 1
    agent = Agent(args)
    agent.remove_stale_containers()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    node = NodeAgent(agent.kube, args.node_name, labels, capacity, HOST_IP, taints=args.taints)
    deadline = time.monotonic() + 60
    while True:
        try:
            agent.guard.join()
            node.register()
            break
        except KubeError as err:
            if time.monotonic() > deadline or agent.stop.is_set():
                log.error("cannot register node %s: %s", args.node_name, err)
                return 1
            log.info("API server not ready (%s); retrying", err)
            time.sleep(1.0)
    threading.Thread(
        target=node.heartbeat,
        args=(agent.stop, agent.guard, args.exit_after_api_loss),
        name="heartbeat",
        daemon=True,
    ).start()
    syncer = threading.Thread(target=agent.sync_pods, name="pods", daemon=True)
    syncer.start()
    agent.stop.wait()
    agent.shutdown()
    if agent.runc is not None:
        # Every container has stopped: leave no empty state directory per cluster in /run behind.
        with contextlib.suppress(OSError):
            agent.runc.root.rmdir()
            agent.runc.root.parent.rmdir()
    log.info("stopped")
    return 0
