"""How many CPUs a worker may use, and how its processes share them.

A pod's CPU limit is a cgroup bandwidth quota, and nothing in the process sees it by counting CPUs:
``os.cpu_count()`` and the affinity mask both report the node's cores.  PyTorch (OpenMP, MKL) sizes its
intra-op thread pool from the cores, so a worker limited to 4 CPUs on a 64-core node would run 32 threads
in lockstep against a 4-CPU quota, and the kernel would throttle the whole group most of every period.
Here the quota is read (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; the
tightest on the process's cgroup and those above it), and:

* ``default_http_workers``: half the CPUs for the HTTP processes (1 to 4);
* ``intra_op_threads``: the model's CPU threads, set before torch is imported (``OMP_NUM_THREADS``, which
  torch, MKL and OpenBLAS all read).  Only when something caps the worker below the node's cores (or the
  operator of the server asks, ``--intra-op-threads``): otherwise torch's own default stays, which counts
  physical cores, not hyperthreads.  The model gets every CPU of the budget, not "CPUs minus the HTTP
  share": measured on 2 CPUs, one thread gave 0.60-0.72x the throughput of two at 64 concurrent
  32-sentence requests; the HTTP processes run at a lower priority and take what the model leaves.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

log = logging.getLogger("modelpool.cpus")

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The variable the OpenMP runtime (torch's intra-op pool), MKL and OpenBLAS read when they start.
THREADS_ENV = "OMP_NUM_THREADS"


def quota_cpus(quota: str, period: str) -> float | None:
    """Pure: the CPUs a CFS quota allows (``"max"`` or a negative quota, v1's ``-1``: no limit, None)."""
    if quota.strip() == "max":
        return None
    q, p = int(quota), int(period)
    if q <= 0 or p <= 0:
        return None
    return q / p


def cgroup_paths(self_cgroup: str) -> tuple[str | None, str | None]:
    """Pure: this process's cgroup v2 path and its v1 ``cpu`` controller's path, from
    ``/proc/self/cgroup`` (None where that hierarchy does not hold it)."""
    v2 = v1 = None
    for line in self_cgroup.splitlines():
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if number == "0" and not controllers:
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _levels(mount: Path, path: str | None) -> list[Path]:
    """``mount/path`` and every cgroup above it up to ``mount`` (a limit anywhere above applies too; in a
    container whose cgroup is mounted as the root, the path does not exist there and the root is it)."""
    own = mount / (path or "/").lstrip("/")
    return [own, *own.parents[: len(own.parents) - len(mount.parents)]]


def _read_quota(directory: Path) -> float | None:
    """The limit set on one cgroup directory (v2 ``cpu.max``, or v1's quota and period), None: none."""
    try:
        if (directory / "cpu.max").exists():
            return quota_cpus(*(directory / "cpu.max").read_text().split()[:2])
        quota = (directory / "cpu.cfs_quota_us").read_text()
        return quota_cpus(quota, (directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError, TypeError):
        return None


def cgroup_quota(root: Path = CGROUP_ROOT, self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The tightest CPU limit on this process's cgroup and those above it, in CPUs (None: no limit, or
    none readable): cgroup v2 where ``root`` is the unified hierarchy, else v1's ``cpu`` controller."""
    try:
        v2, v1 = cgroup_paths(self_cgroup.read_text())
    except OSError:
        v2 = v1 = None
    mount, path = (root, v2) if (root / "cgroup.controllers").exists() else (root / "cpu", v1)
    limits = [q for q in map(_read_quota, _levels(mount, path)) if q is not None]
    return min(limits) if limits else None


def visible_cpus() -> int:
    """The CPUs this process may be scheduled on (its affinity), ignoring any quota."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def available_cpus() -> float:
    """CPUs this process may use: its affinity, lowered by a cgroup CPU limit (a pod's ``limits.cpu``),
    at least 1."""
    quota = cgroup_quota()
    cpus = float(visible_cpus())
    return cpus if quota is None else max(1.0, min(cpus, quota))


def default_http_workers(cpus: float) -> int:
    """Pure: HTTP processes for a worker with ``cpus`` CPUs: half of them (the model needs the rest),
    at least 1, at most 4 (beyond that, one inference process is the limit).  2 CPUs -> 1."""
    return min(4, max(1, int(cpus) // 2))


def intra_op_threads(requested: int | None, cpus: float, cores: int, env: Mapping[str, str]) -> int | None:
    """Pure: the model's CPU threads to set, or None to leave the runtime's default.

    ``requested`` (``--intra-op-threads``) wins; then an ``OMP_NUM_THREADS`` the pod already sets; then,
    when ``cpus`` (the budget) is below the ``cores`` the process can see, the budget rounded down (one
    thread more than the quota can run gets the whole lockstep group throttled), at least 1."""
    if requested is not None:
        return requested
    if env.get(THREADS_ENV, "").strip():
        return None
    if cpus < cores:
        return max(1, math.floor(cpus))
    return None


def size_intra_op_threads(requested: int | None, env: MutableMapping[str, str] | None = None) -> None:
    """Set the model's CPU threads in ``env`` (this process's environment) before torch is imported."""
    env = os.environ if env is None else env
    cores, cpus = visible_cpus(), available_cpus()
    threads = intra_op_threads(requested, cpus, cores, env)
    if threads is not None:
        env[THREADS_ENV] = str(threads)
    log.info(
        "CPU budget %.2f of %d CPUs; the model's CPU threads: %s",
        cpus, cores, threads if threads is not None else env.get(THREADS_ENV) or "torch's default",
    )  # fmt: skip


__all__ = [
    "available_cpus",
    "cgroup_paths",
    "cgroup_quota",
    "default_http_workers",
    "intra_op_threads",
    "quota_cpus",
    "size_intra_op_threads",
    "visible_cpus",
]
