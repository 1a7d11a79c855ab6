"""A cgroup with a CPU quota, as a pod's ``limits.cpu`` makes one, for a process started inside it
(``bench.cpu_quota`` and ``tests/server/process/test_cpu_quota.py``); a favoured cgroup, whose members win
the cores from the rest of a shared machine (``bench.limits --favoured``).  Needs root and a writable cgroup
hierarchy: cgroup v2 with the ``cpu`` controller, else v1's ``cpu`` controller."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
# How long removal waits for the kernel to take the last exited member out (a cgroup with one is busy).
EMPTY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CpuCgroup:
    """One cgroup directory and its quota."""

    path: Path
    cpus: float

    def join(self) -> None:
        """Move the calling process into the cgroup (a ``preexec_fn``: the child joins before it runs,
        and every process it starts is born inside)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def members(self) -> set[int]:
        return {int(pid) for pid in (self.path / "cgroup.procs").read_text().split()}

    def throttling(self) -> dict[str, int]:
        """``cpu.stat``: periods, throttled periods, throttled time (v1 ns / v2 us, as the kernel says)."""
        lines = (self.path / "cpu.stat").read_text().splitlines()
        return {key: int(value) for key, value in (line.split() for line in lines)}


def _make(name: str, cpus: float) -> Path:
    """The cgroup directory with its quota set; OSError where this machine does not allow it."""
    quota = str(round(cpus * PERIOD_US))
    if (ROOT / "cgroup.controllers").exists():
        if "cpu" not in (ROOT / "cgroup.controllers").read_text().split():
            raise OSError("no cpu controller in the unified hierarchy")
        (ROOT / "cgroup.subtree_control").write_text("+cpu")
        path = ROOT / name
        path.mkdir()
        (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        return path
    path = ROOT / "cpu" / name
    path.mkdir()
    (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
    (path / "cpu.cfs_quota_us").write_text(quota)
    return path


# The largest CPU weight each version allows (v1 cpu.shares, v2 cpu.weight; a process's is 1024 / 100).
FAVOURED_SHARES = 262_144
FAVOURED_WEIGHT = 10_000


@contextlib.contextmanager
def favoured() -> Iterator[Path]:
    """This process (and every process it starts from now on) in a fresh cgroup of the largest CPU weight:
    on a machine shared with other work, what it runs gets the cores whenever it wants them, as on a
    machine of its own, while the nice values inside it still rank its members.  Back in the root cgroup
    on exit.  Raises OSError where cgroups cannot be made here."""
    name = f"modelpool-favoured-{uuid.uuid4().hex[:8]}"
    if (ROOT / "cgroup.controllers").exists():
        if "cpu" not in (ROOT / "cgroup.controllers").read_text().split():
            raise OSError("no cpu controller in the unified hierarchy")
        (ROOT / "cgroup.subtree_control").write_text("+cpu")
        top, path = ROOT, ROOT / name
        path.mkdir()
        (path / "cpu.weight").write_text(str(FAVOURED_WEIGHT))
    else:
        top, path = ROOT / "cpu", ROOT / "cpu" / name
        path.mkdir()
        (path / "cpu.shares").write_text(str(FAVOURED_SHARES))
    try:
        (path / "cgroup.procs").write_text(str(os.getpid()))
        yield path
    finally:
        (top / "cgroup.procs").write_text(str(os.getpid()))
        deadline = time.monotonic() + EMPTY_TIMEOUT_S
        while (path / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        path.rmdir()


@contextlib.contextmanager
def cpu_cgroup(cpus: float) -> Iterator[CpuCgroup]:
    """A fresh cgroup allowing ``cpus`` CPUs; removed on exit, once its members have gone (stop them
    first).  Raises OSError where cgroups cannot be made here."""
    path = _make(f"modelpool-{uuid.uuid4().hex[:8]}", cpus)
    try:
        yield CpuCgroup(path, cpus)
    finally:
        deadline = time.monotonic() + EMPTY_TIMEOUT_S
        while (path / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        path.rmdir()


__all__ = ["CpuCgroup", "cpu_cgroup", "favoured"]
