"""One pod bound to the process node: a thread that runs its containers and writes its status.

The thread is the only writer of this pod's status and the only owner of its processes.  It wakes on every
update of the pod (from the agent's watch) and at least every TICK seconds to poll processes and probes;
a status patch is sent only when the computed status differs from the last one written.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from testkit.processnode.container import ContainerRunner, PodContext
from testkit.processnode.kubeapi import STRATEGIC_MERGE, Kube, KubeError, pod_event, pod_path
from testkit.processnode.podspec import SpecError, backoff_delay, grace_seconds
from testkit.processnode.podstatus import ConditionClock, pod_status, rfc3339
from testkit.processnode.volumes import VolumeError, pod_volume_dirs, remove_pod_dir

JSON = dict[str, Any]
log = logging.getLogger("processnode.pod")
TICK = 0.2
# Bounded back-off for retries while something is missing (a PVC not bound yet) or the API server is
# away (a control-plane restart): first retry after the initial delay, doubling up to the cap.
MOUNT_RETRY = (0.5, 8.0)
WRITE_RETRY = (0.2, 5.0)


class Retry:
    """Consecutive failures of one kind of call and when the next attempt is due (monotonic time)."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self.failures = 0
        self.next_at = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def failed(self, now: float) -> None:
        self.failures += 1
        self.next_at = now + backoff_delay(self.failures, self.initial, self.maximum)

    def succeeded(self) -> int:
        """Reset; returns how many failures came before this success."""
        failures, self.failures, self.next_at = self.failures, 0, 0.0
        return failures


def _restart_counts(pod: JSON) -> dict[str, int]:
    """Restart counts already recorded (the agent restarted while the pod lived): keep counting on."""
    counts: dict[str, int] = {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        counts[str(cs.get("name"))] = int(cs.get("restartCount", 0) or 0)
    return counts


class PodWorker(threading.Thread):
    def __init__(self, kube: Kube, pod: JSON, ctx: PodContext, on_exit: Any) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.kube = kube
        self.ctx = ctx
        self.namespace = str(meta["namespace"])
        self.pod_name = str(meta["name"])
        self.uid = str(meta["uid"])
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._latest = pod
        self._wake = threading.Event()
        self._gone = threading.Event()
        self._shutdown = threading.Event()
        self._clock = ConditionClock()
        self._start_time = datetime.now(UTC)
        self._mounted = False
        self._mount_retry = Retry(*MOUNT_RETRY)
        self._write_retry = Retry(*WRITE_RETRY)
        self._last_event = ""
        counts = _restart_counts(pod)
        self.runners = [
            ContainerRunner(c, ctx, time.monotonic, counts.get(str(c["name"]), 0))
            for c in (pod.get("spec") or {}).get("containers") or []
        ]

    # -- called from the agent's threads ---------------------------------------------------------------
    def update(self, pod: JSON) -> None:
        with self._lock:
            self._latest = pod
        self._wake.set()

    def gone(self) -> None:
        """The pod object was removed without us (force delete): kill its processes at once."""
        self._gone.set()
        self._wake.set()

    def shutdown(self) -> None:
        """The agent is stopping: end the processes, leave the pod object alone."""
        self._shutdown.set()
        self._wake.set()

    # -- the pod's own thread -----------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("pod %s/%s: worker failed", self.namespace, self.pod_name)
            for r in self.runners:
                r.kill()
        finally:
            self._on_exit(self)

    def _loop(self) -> None:
        last: JSON | None = None
        terminating = False
        while True:
            with self._lock:
                pod = self._latest
            self.ctx.pod = pod
            if self._gone.is_set() or self._shutdown.is_set():
                for r in self.runners:
                    r.stop(0.0 if self._gone.is_set() else 3.0)
                self._drain(5.0)
                if self._gone.is_set():
                    remove_pod_dir(self.ctx.pod_dir)  # an agent that stops keeps them, as a kubelet does
                return
            if pod["metadata"].get("deletionTimestamp") and not terminating:
                terminating = True
                grace = grace_seconds(pod)
                log.info("pod %s/%s: deleting, grace %.0fs", self.namespace, self.pod_name, grace)
                for r in self.runners:
                    r.stop(grace)
            if not self._mounted and not terminating:
                self._mount(pod)
            if self._mounted or terminating:
                for r in self.runners:
                    r.tick(stopping=terminating)
            if terminating and not any(r.running for r in self.runners):
                self._write(last)
                self._remove_pod_object()
                remove_pod_dir(self.ctx.pod_dir)
                return
            last = self._write(last)
            self._wake.wait(TICK)
            self._wake.clear()

    def _mount(self, pod: JSON) -> None:
        """Set up every volume before any container starts; until then the pod stays ContainerCreating,
        with a FailedMount event for each new reason (a PVC not bound yet, a hostPath type mismatch)."""
        now = time.monotonic()
        if not self._mount_retry.due(now):
            return
        try:
            self._resolve_images(pod)
            mint = self.ctx.mint if self.ctx.pod_images else None
            self.ctx.volume_dirs = pod_volume_dirs(pod, self.ctx.pod_dir, self.ctx.get, mint)
        except SpecError as err:  # an image the store cannot describe: retried, as an image pull is
            self._mount_retry.failed(now)
            self._event("Failed", err.message)
            return
        except VolumeError as err:
            self._mount_retry.failed(now)
            self._event("FailedMount", str(err))
            return
        except (KubeError, OSError) as err:  # the API server is away, or the disk refused: retry
            self._mount_retry.failed(now)
            log.warning("pod %s/%s: volumes not set up yet: %s", self.namespace, self.pod_name, err)
            return
        self._mount_retry.succeeded()
        self._mounted = True

    def _resolve_images(self, pod: JSON) -> None:
        """Image mode: the pod runs from its images when the store holds every container's image;
        otherwise (or with image mode off) its containers run as host processes, as before."""
        store = self.ctx.images
        if store is None or self.ctx.pod_images:
            return
        images = {}
        for container in (pod.get("spec") or {}).get("containers") or []:
            image = store.lookup(str(container.get("image") or ""))
            if image is None:
                log.info(
                    "pod %s/%s: image %r is not in %s: running it as host processes",
                    self.namespace,
                    self.pod_name,
                    container.get("image"),
                    store.root,
                )
                return
            images[str(container["name"])] = image
        self.ctx.pod_images = images
        log.info(
            "pod %s/%s: running from its images %s",
            self.namespace,
            self.pod_name,
            sorted({i.name for i in images.values()}),
        )

    def _event(self, reason: str, message: str) -> None:
        """Record a Warning event about this pod (once per distinct message, like the kubelet's dedup)."""
        if message == self._last_event:
            return
        log.info("pod %s/%s: %s: %s", self.namespace, self.pod_name, reason, message)
        body = pod_event(
            self.ctx.pod,
            self.ctx.node_name,
            reason=reason,
            message=message,
            warning=True,
            now=rfc3339(datetime.now(UTC)),
        )
        try:
            self.kube.request("POST", f"/api/v1/namespaces/{self.namespace}/events", body=body)
        except KubeError as err:
            log.warning("pod %s/%s: event not recorded: %s", self.namespace, self.pod_name, err)
            return
        self._last_event = message

    def _drain(self, limit: float) -> None:
        deadline = time.monotonic() + limit
        while any(r.running for r in self.runners) and time.monotonic() < deadline:
            for r in self.runners:
                r.tick(stopping=True)
            time.sleep(0.05)
        for r in self.runners:
            r.kill()

    def _write(self, last: JSON | None) -> JSON | None:
        status = pod_status(
            [r.record for r in self.runners],
            pod_ip=self.ctx.pod_ip,
            host_ip=self.ctx.host_ip,
            start_time=self._start_time,
            clock=self._clock,
            now=datetime.now(UTC),
            volumes_ready=self._mounted,
        )
        now = time.monotonic()
        if status == last or not self._write_retry.due(now):
            return last
        body = {"metadata": {"uid": self.uid}, "status": status}
        try:
            self.kube.request(
                "PATCH",
                pod_path(self.namespace, self.pod_name, "status"),
                body=body,
                content_type=STRATEGIC_MERGE,
            )
        except KubeError as err:
            if err.status == 404:
                self._gone.set()
                return last
            self._write_retry.failed(now)
            if self._write_retry.failures == 1:  # one line per outage, not one per tick
                log.warning(
                    "pod %s/%s: status patch failed, retrying: %s", self.namespace, self.pod_name, err
                )
            return last
        if self._write_retry.succeeded():
            log.info("pod %s/%s: status written again", self.namespace, self.pod_name)
        return status

    def _remove_pod_object(self) -> None:
        """The kubelet's last word on a deleted pod: remove the object now that its processes are gone.
        (Not named `_delete`: threading.Thread calls its own `_delete` whenever a thread ends.)"""
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        for _ in range(5):
            try:
                self.kube.request("DELETE", pod_path(self.namespace, self.pod_name), body=body)
                return
            except KubeError as err:
                if err.status in (404, 409):
                    return
                log.warning("pod %s/%s: delete failed: %s", self.namespace, self.pod_name, err)
            except OSError as err:
                log.warning("pod %s/%s: delete failed: %s", self.namespace, self.pod_name, err)
            time.sleep(1.0)
