"""Pure: the pod status the kubelet would write, from what the agent knows about each container.

`ContainerRecord` is the agent's view of one container (mutated only by that pod's worker thread);
`pod_status` turns records into the `status` JSON, with explicit nulls so a strategic-merge patch replaces
a container's state instead of merging `waiting` and `running` together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

JSON = dict[str, Any]
MAX_MESSAGE = 4096  # the kubelet's cap on a termination message


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Terminated:
    exit_code: int
    reason: str
    message: str
    started_at: datetime
    finished_at: datetime
    container_id: str

    def to_json(self) -> JSON:
        out: JSON = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": rfc3339(self.started_at),
            "finishedAt": rfc3339(self.finished_at),
            "containerID": self.container_id,
        }
        if self.message:
            out["message"] = self.message[:MAX_MESSAGE]
        return out


@dataclass
class ContainerRecord:
    name: str
    image: str
    state: str = "waiting"  # waiting | running | terminated
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    started_at: datetime | None = None
    container_id: str = ""
    terminated: Terminated | None = None
    last_terminated: Terminated | None = None
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    final: bool = False  # terminated and will not be restarted
    ever_ran: bool = False

    def to_json(self) -> JSON:
        state: JSON = {"waiting": None, "running": None, "terminated": None}
        if self.state == "running" and self.started_at is not None:
            state["running"] = {"startedAt": rfc3339(self.started_at)}
        elif self.state == "terminated" and self.terminated is not None:
            state["terminated"] = self.terminated.to_json()
        else:
            waiting: JSON = {"reason": self.waiting_reason}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            state["waiting"] = waiting
        out: JSON = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated.to_json()} if self.last_terminated else {},
        }
        if self.container_id and self.state == "running":
            out["containerID"] = self.container_id
        return out


@dataclass
class ConditionClock:
    """Remembers when each pod condition last changed, so lastTransitionTime is stable across patches."""

    seen: dict[str, tuple[str, str]] = field(default_factory=dict)

    def condition(self, ctype: str, ok: bool, now: datetime, reason: str = "") -> JSON:
        status = "True" if ok else "False"
        prev = self.seen.get(ctype)
        when = prev[1] if prev and prev[0] == status else rfc3339(now)
        self.seen[ctype] = (status, when)
        out: JSON = {"type": ctype, "status": status, "lastTransitionTime": when, "lastProbeTime": None}
        out["reason"] = None if ok or not reason else reason
        return out


def pod_phase(records: list[ContainerRecord]) -> str:
    """Pending until every container has run once; Succeeded/Failed once every container is final."""
    if records and all(r.final for r in records):
        ok = all(r.terminated is not None and r.terminated.exit_code == 0 for r in records)
        return "Succeeded" if ok else "Failed"
    if records and all(r.ever_ran for r in records):
        return "Running"
    return "Pending"


def pod_status(
    records: list[ContainerRecord],
    *,
    pod_ip: str,
    host_ip: str,
    start_time: datetime,
    clock: ConditionClock,
    now: datetime,
    volumes_ready: bool = True,
) -> JSON:
    """The pod's `status` as a strategic-merge patch body (PodScheduled is the scheduler's, left alone).
    Until its volumes are set up a pod is not ready to start containers (PodReadyToStartContainers)."""
    phase = pod_phase(records)
    all_ready = bool(records) and all(r.ready for r in records)
    not_ready = "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"
    return {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": rfc3339(start_time),
        "conditions": [
            clock.condition("PodReadyToStartContainers", volumes_ready, now),
            clock.condition("Initialized", True, now),
            clock.condition("ContainersReady", all_ready, now, not_ready),
            clock.condition("Ready", all_ready, now, not_ready),
        ],
        "containerStatuses": [r.to_json() for r in records],
    }
