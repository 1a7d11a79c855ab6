"""The worker's CPU budget (``model_server/cpu_budget.py``): the cgroup quota read from files laid out as
the kernel lays them out, and the decisions as pure functions (a real server in a real 1-CPU cgroup:
``tests/server/process/test_cpu_quota.py``)."""

from __future__ import annotations

from pathlib import Path

from model_server.config import load_config
from model_server.cpu_budget import (
    THREADS_ENV,
    TOKENIZER_THREADS_ENV,
    cgroup_paths,
    cgroup_quota,
    plan_threads,
    quota_cpus,
    size_threads,
)

V1_SELF = "12:cpu,cpuacct:/kubepods/pod1/c1\n11:memory:/kubepods/pod1/c1\n0::/\n"
V2_SELF = "0::/kubepods.slice/pod1/c1\n"


def test_quota_cpus() -> None:
    assert quota_cpus("200000", "100000") == 2.0
    assert quota_cpus("150000", "100000") == 1.5
    assert quota_cpus("max", "100000") is None
    assert quota_cpus("-1", "100000") is None  # cgroup v1: no limit


def test_cgroup_paths() -> None:
    assert cgroup_paths(V1_SELF) == ("/", "/kubepods/pod1/c1")
    assert cgroup_paths(V2_SELF) == ("/kubepods.slice/pod1/c1", None)
    assert cgroup_paths("") == (None, None)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_quota_v2_takes_the_tightest_level(tmp_path: Path) -> None:
    root, me = tmp_path / "cg", tmp_path / "self"
    _write(root / "cgroup.controllers", "cpu memory")
    _write(root / "kubepods.slice" / "cpu.max", "300000 100000")
    _write(root / "kubepods.slice" / "pod1" / "c1" / "cpu.max", "max 100000")
    _write(me, V2_SELF)
    assert cgroup_quota(root, me) == 3.0  # the pod's limit above an unlimited container
    _write(root / "kubepods.slice" / "pod1" / "c1" / "cpu.max", "250000 100000")
    assert cgroup_quota(root, me) == 2.5


def test_cgroup_quota_v1_and_a_container_whose_cgroup_is_the_mount(tmp_path: Path) -> None:
    root, me = tmp_path / "cg", tmp_path / "self"
    _write(me, V1_SELF)
    _write(root / "cpu" / "cpu.cfs_quota_us", "400000\n")  # the container's own cgroup, mounted as root
    _write(root / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_quota(root, me) == 4.0
    _write(root / "cpu" / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_quota(root, me) is None
    assert cgroup_quota(tmp_path / "nothing", tmp_path / "missing") is None


def test_threads_under_a_cpu_limit() -> None:
    def threads(requested: int | None, quota: float | None, env: dict[str, str]) -> int | None:
        return plan_threads(requested, quota=quota, share=None, cores=64, env=env).threads

    assert threads(3, 2.0, {}) == 3  # --intra-op-threads wins
    assert threads(None, 2.0, {THREADS_ENV: "8"}) is None  # the pod's own
    assert threads(None, 2.5, {THREADS_ENV: " "}) == 2  # rounded down
    assert threads(None, 0.5, {}) == 1
    assert threads(None, 64.0, {}) is None  # no cap: torch's default
    assert threads(None, None, {}) is None


def test_size_threads_sets_the_environment() -> None:
    env: dict[str, str] = {}
    size_threads(3, None, env)
    assert env == {THREADS_ENV: "3", TOKENIZER_THREADS_ENV: "3"}


def test_intra_op_threads_flag() -> None:
    base = ["--model", "/m", "--task", "text-embedding"]
    assert load_config([*base, "--intra-op-threads", "4"]).intra_op_threads == 4
    assert load_config(base).intra_op_threads is None
