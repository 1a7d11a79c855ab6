"""Latency probes that run beside a load: ``/v2/health/live`` and ``/stats``, a few times a second, from a
thread of the bench process, on a keep-alive connection of their own."""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from typing import Any

from testkit.load import percentile


class HealthProbe:
    """Times ``GET /v2/health/live`` and ``GET /stats`` every ``period`` seconds while a run goes on."""

    def __init__(self, url: str, period: float = 0.05, enabled: bool = True) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.period = period
        self.live: list[float] = []
        self.stats: list[float] = []
        self.failures = 0
        self.not_ok = 0  # answers other than 200 (a live worker must never fail its liveness under load)
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _get(self, conn: http.client.HTTPConnection, path: str) -> float:
        started = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        self.not_ok += response.status != 200
        return time.perf_counter() - started

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        while not self._stop.wait(self.period):
            try:
                self.live.append(self._get(conn, "/v2/health/live"))
                self.stats.append(self._get(conn, "/stats"))
            except (OSError, http.client.HTTPException):
                self.failures += 1
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.close()

    def __enter__(self) -> HealthProbe:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()

    def summary(self) -> dict[str, Any]:
        """p50/p99/max in milliseconds of each probe, and how many were taken."""
        return {
            "samples": len(self.live),
            "failures": self.failures,
            "not_ok": self.not_ok,
            "live_p50_ms": percentile(self.live, 50),
            "live_p99_ms": percentile(self.live, 99),
            "live_max_ms": max(self.live, default=0.0) * 1000,
            "stats_p50_ms": percentile(self.stats, 50),
            "stats_p99_ms": percentile(self.stats, 99),
            "stats_max_ms": max(self.stats, default=0.0) * 1000,
        }
