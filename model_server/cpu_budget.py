"""How many CPUs a worker may use, and how its processes share them.

A pod's CPU limit is a cgroup bandwidth quota, and nothing in the process sees it by counting CPUs:
``os.cpu_count()`` and the affinity mask both report the node's cores.  PyTorch (OpenMP, MKL) sizes its
intra-op thread pool from the cores, so a worker limited to 4 CPUs on a 64-core node would run 32 threads
in lockstep against a 4-CPU quota, and the kernel would throttle the whole group most of every period.
Here the quota is read (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; the
tightest on the process's cgroup and those above it), and:

* ``default_http_workers``: half the CPUs for the HTTP processes (1 to 4);
* ``plan_threads`` (``size_threads`` sets it): the model's CPU threads, set before torch is imported
  (``OMP_NUM_THREADS``, which torch, MKL and OpenBLAS all read).  Only when something caps the worker
  below the node's cores (or the operator of the server asks, ``--intra-op-threads``): otherwise torch's
  own default stays, which counts physical cores, not hyperthreads.  The model gets every CPU of the
  budget, not "CPUs minus the HTTP share": measured on 2 CPUs, one thread gave 0.60-0.72x the throughput
  of two at 64 concurrent 32-sentence requests; the HTTP processes run at a lower priority and take what
  the model leaves.  The worker's CPU *share* caps it too: a pod with a CPU request and no limit has no
  quota to read, yet shares the node with other workers; each sizing its pools to every core, their
  lockstep pools stall each other (two MiniLM servers on 2 cores: 0.44x the throughput of one with
  torch's default threads, 1.2x with one thread each).  The operator passes the pod's request
  (``modelpool_contract.flags.CPU_SHARE_ENV``); a limit, being enforced, wins over it.  The plan covers
  torch's intra-op and inter-op pools and the tokenizer's (``RAYON_NUM_THREADS``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from modelpool_contract.stats import THREAD_SOURCES

log = logging.getLogger("modelpool.cpus")

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The variable the OpenMP runtime (torch's intra-op pool), MKL and OpenBLAS read when they start.
THREADS_ENV = "OMP_NUM_THREADS"
# The tokenizers library's (Rust, rayon) thread pool, and its switch for parallel batch encoding.
TOKENIZER_THREADS_ENV = "RAYON_NUM_THREADS"
TOKENIZERS_PARALLELISM_ENV = "TOKENIZERS_PARALLELISM"


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


@dataclass(frozen=True)
class ThreadPlan:
    """The model's CPU threads: ``threads`` for torch's intra-op and inter-op pools and the tokenizer's
    (None: each library's own default), ``sized_from`` one of ``THREAD_SOURCES``, ``cpus`` the CPUs that
    source allows (None where it says nothing: explicit, the environment's, torch's default)."""

    threads: int | None
    sized_from: str
    cpus: float | None = None

    def __post_init__(self) -> None:
        assert self.sized_from in THREAD_SOURCES, self.sized_from


def plan_threads(
    requested: int | None, *, quota: float | None, share: float | None, cores: int, env: Mapping[str, str]
) -> ThreadPlan:
    """Pure: the model's CPU threads.  ``--intra-op-threads`` wins; then an ``OMP_NUM_THREADS`` the pod
    sets (left to the runtime, the other pools too); then a CPU limit (``quota``, CPUs) below the
    ``cores`` the process can see; then the CPU share the operator passed (``share``, CPUs, the pod's
    request: 0 or None is none) below them; each rounded down, at least 1.  Else torch's default."""
    if requested is not None:
        return ThreadPlan(requested, "explicit")
    if env.get(THREADS_ENV, "").strip():
        return ThreadPlan(None, "environment")
    if quota is not None and quota < cores:
        return ThreadPlan(max(1, math.floor(quota)), "quota", quota)
    if share and share < cores:
        return ThreadPlan(max(1, math.floor(share)), "share", share)
    return ThreadPlan(None, "default")


def thread_env(plan: ThreadPlan, env: Mapping[str, str]) -> dict[str, str]:
    """Pure: the variables to set, before torch and the tokenizer start, for ``plan`` (a variable the pod
    already sets is kept).  One thread: no parallel tokenizing at all (rayon would still start a pool)."""
    if plan.threads is None:
        return {}
    wanted = {THREADS_ENV: str(plan.threads), TOKENIZER_THREADS_ENV: str(plan.threads)}
    if plan.threads == 1:
        wanted[TOKENIZERS_PARALLELISM_ENV] = "false"
    return {k: v for k, v in wanted.items() if k == THREADS_ENV or not env.get(k, "").strip()}


def size_threads(
    requested: int | None, share_millicores: int | None, env: MutableMapping[str, str] | None = None
) -> ThreadPlan:
    """Plan the model's CPU threads and set them in ``env`` (this process's environment) before torch is
    imported; torch's inter-op pool is set after its import (``set_interop_threads``)."""
    env = os.environ if env is None else env
    plan = plan_threads(
        requested,
        quota=cgroup_quota(),
        share=share_millicores / 1000 if share_millicores else None,
        cores=visible_cpus(),
        env=env,
    )
    env.update(thread_env(plan, env))
    log.info(
        "the model's CPU threads: %s (from %s%s)",
        plan.threads or env.get(THREADS_ENV) or "torch's default", plan.sized_from,
        "" if plan.cpus is None else f": {plan.cpus:g} of {visible_cpus()} CPUs",
    )  # fmt: skip
    return plan


def set_interop_threads(plan: ThreadPlan) -> None:
    """torch's inter-op pool as planned (call after ``import torch``, before any parallel work)."""
    if plan.threads is None:
        return
    import torch

    try:
        torch.set_num_interop_threads(plan.threads)
    except RuntimeError as exc:  # it has started already (a handler ran parallel work during import)
        log.warning("cannot size torch's inter-op threads: %s", exc)


__all__ = [
    "ThreadPlan",
    "available_cpus",
    "cgroup_paths",
    "cgroup_quota",
    "default_http_workers",
    "plan_threads",
    "quota_cpus",
    "set_interop_threads",
    "size_threads",
    "thread_env",
    "visible_cpus",
]
