"""RSS of the operator and the gateway, sampled from ``/proc/<pid>/status`` (VmRSS) every few seconds.

Both are killed and restarted by the soak, so each sample keeps its pid: the report compares the first and
the last sample of the longest-lived process, and gives the peak over all."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def vm_rss(pid: int) -> int | None:
    """Bytes of VmRSS of ``pid`` (None when it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


@dataclass
class RssSampler:
    """A thread sampling every process ``pids()`` names (role -> pid, None while it is down)."""

    pids: Callable[[], dict[str, int | None]]
    interval: float = 2.0
    samples: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.sample()

    def sample(self) -> None:
        for role, pid in self.pids().items():
            rss = vm_rss(pid) if pid is not None else None
            if rss is not None and pid is not None:
                self.samples.setdefault(role, []).append((time.monotonic(), pid, rss))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def summary(self, settle: float = 20.0) -> dict[str, tuple[int, int, int, int, float]]:
        """Role -> (first bytes, last bytes, peak bytes, processes seen, seconds between first and last).

        First and last are of the longest-lived process (the others were killed early), its first sample
        taken ``settle`` seconds into its life when it lived that long (start-up allocations are not
        growth); the peak is over every process."""
        out = {}
        for role, rows in self.samples.items():
            by_pid: dict[int, list[tuple[float, int]]] = {}
            for at, pid, rss in rows:
                by_pid.setdefault(pid, []).append((at, rss))
            life = max(by_pid.values(), key=lambda r: r[-1][0] - r[0][0])
            settled = [r for r in life if r[0] - life[0][0] >= settle] or life
            first, last = settled[0], life[-1]
            out[role] = (first[1], last[1], max(r[2] for r in rows), len(by_pid), last[0] - first[0])
        return out
