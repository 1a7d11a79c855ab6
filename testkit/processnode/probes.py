"""Readiness, liveness and startup probes: when each is due (ProbeState, pure bookkeeping) and how one
is carried out (run_probe: httpGet on the pod's loopback IP, tcpSocket, exec), as the kubelet does."""

from __future__ import annotations

import http.client
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from testkit.processnode.podspec import SpecError, resolve_port

JSON = dict[str, Any]


@dataclass
class ProbeState:
    """One probe of one container run; counts consecutive results against the thresholds."""

    spec: JSON
    started: float  # monotonic time the container started

    next_at: float = 0.0
    successes: int = 0
    failures: int = 0
    passed: bool = False  # the last verdict (successThreshold reached, not since failed out)
    failed: bool = False  # failureThreshold reached

    def __post_init__(self) -> None:
        self.next_at = self.started + float(self.spec.get("initialDelaySeconds", 0) or 0)

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10) or 10)

    @property
    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 1) or 1)

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, ok: bool, now: float) -> None:
        self.next_at = now + self.period
        if ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= int(self.spec.get("successThreshold", 1) or 1):
                self.passed = True
                self.failed = False
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.spec.get("failureThreshold", 3) or 3):
                self.failed = True
                self.passed = False


def run_probe(spec: JSON, container: JSON, pod_ip: str, env: Mapping[str, str], timeout: float) -> bool:
    """One probe attempt; True on success.  HTTP: a status in [200, 400), as the kubelet counts it."""
    try:
        if "httpGet" in spec:
            get = spec["httpGet"]
            host = str(get.get("host") or pod_ip)
            port = resolve_port(container, get.get("port", 80))
            conn_cls = (
                http.client.HTTPSConnection if get.get("scheme") == "HTTPS" else http.client.HTTPConnection
            )
            conn = conn_cls(host, port, timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                headers.setdefault("User-Agent", "kube-probe/1.34")
                conn.request("GET", str(get.get("path") or "/"), headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            return 200 <= status < 400
        if "tcpSocket" in spec:
            sock = spec["tcpSocket"]
            port = resolve_port(container, sock.get("port"))
            with socket.create_connection((str(sock.get("host") or pod_ip), port), timeout=timeout):
                return True
        if "exec" in spec:
            argv = [str(a) for a in spec["exec"].get("command") or []]
            done = subprocess.run(argv, env=dict(env), capture_output=True, timeout=timeout, check=False)
            return done.returncode == 0
    except (OSError, http.client.HTTPException, subprocess.TimeoutExpired, ValueError, SpecError):
        return False
    return False
