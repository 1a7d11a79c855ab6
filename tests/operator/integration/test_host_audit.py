"""Issue 21's KWOK check, small: shared pools of mixed sizes and priorities over simulated GPU hosts
(``testkit.hostsim``: KWOK host pods answered on their pod IPs as ``modelpool-server --shared-host`` does)
with the real operator and API server; the auditor checks every transition on the hosts: no device or
host RAM over-committed, no load refused for room, no Loading/Waking model slept or unloaded, every
eviction by the priority rule (a sleep takes the lowest priority, then the least recently used, of any
priority; an unload only a lower priority than the newcomer's), no pool left short while room could be
made for it; the placements converge, and again after churn. A host pod of two GPUs (``gpusPerHost: 2``)
takes models on both devices, never over-committing either (the auditor checks each), and the
ModelHost's status shows both devices' ledgers.
(``python -m bench.placement`` is the large version: 100 pools over 8 hosts.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.hostsim import Audit, HostSim
from testkit.kubectl import apply, wait_established, wait_for
from testkit.services import (
    KWOK_GPU_PLACEMENT,
    OperatorProcess,
    budget_manifest,
    host_manifest,
    shared_pool_manifest,
    stop_all,
)

pytestmark = pytest.mark.cluster

GI = 1 << 30

#: 12 pools (declared 1-3 Gi, priorities 0-2) over 2 hosts of 11 Gi of device (each loaded model's process
#: holds the GPU default overhead, 512 MiB, awake or asleep: about 8 Gi left for awake weights with six
#: models on a host), 16 Gi parked: about a third of them fit awake, the rest sleep (so room is made over
#: and over), and every one fits somewhere.
POOLS = {f"p{i:02d}": (1 + (i * 7) % 3, i % 3) for i in range(12)}
#: Each pool's priority and replicas as the test last set them (what the auditor checks against).
PRIORITY = {name: priority for name, (_, priority) in POOLS.items()}
REPLICAS: dict[str, int] = {}
#: Each pool's declared bytes as the test last set them (an unload for changed settings is no eviction).
DECLARED = {name: gib * GI for name, (gib, _) in POOLS.items()}


def shared_pool(name: str, gib: int, priority: int, replicas: int = 1) -> dict[str, Any]:
    return shared_pool_manifest(name, host="gpus", gib=gib, priority=priority, replicas=replicas)


@pytest.fixture
def audited(crds: Cluster, tmp_path: Path) -> Iterator[tuple[str, HostSim]]:
    wait_established(crds, "modelhosts.modelpool.dev")
    namespace = f"audit-{uuid.uuid4().hex[:8]}"
    budget = f"audit-{uuid.uuid4().hex[:6]}"
    crds.kubectl("create", "namespace", namespace)
    apply(crds, {**budget_manifest("64Gi"), "metadata": {"name": budget}})
    port = free_port()
    operator = OperatorProcess(
        crds,
        (namespace,),
        tmp_path / "operator.log",
        MODELPOOL_OPERATOR_BUDGET_NAME=budget,
        MODELPOOL_OPERATOR_SERVER_PROBE_PORT=str(port),
    )
    audit = Audit(lambda m: PRIORITY.get(m, 0), lambda m: REPLICAS.get(m, 1), DECLARED.get)
    sim = HostSim(crds.kubeconfig, namespace, port, audit=audit, load_s=0.3)
    sim.start()
    try:
        yield namespace, sim
    finally:
        sim.stop()
        crds.kubectl(
            "delete", "modelpools,modelhosts", "--all", "-n", namespace, "--timeout=30s", check=False
        )
        crds.kubectl("delete", "modelbudget", budget, "--ignore-not-found", "--wait=false")
        stop_all([operator], show_logs=True, what="operator")
        crds.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def converge(sim: HostSim, wanted: dict[str, tuple[int, int, int]], timeout: float) -> None:
    """The placements settle, and a pool left short could not be given room (priority decides)."""
    try:
        wait_for(lambda: sim.converged(wanted), timeout=timeout, interval=0.5, message="placements converge")
    except Exception as exc:
        why = f"{sim.placements()} {sim.wrongly_short(wanted)} {sim.audit.violations} {sim.errors}"
        raise AssertionError(f"{exc}: {why}") from None


def test_shared_pools_over_simulated_hosts_never_over_commit_and_converge(
    crds: Cluster, audited: tuple[str, HostSim]
) -> None:
    namespace, sim = audited
    host = {"replicas": 2, "gpusPerHost": 1, "deviceMemory": "11Gi", "hostMemory": "16Gi"}
    apply(crds, host_manifest("gpus", **host, **KWOK_GPU_PLACEMENT), namespace)
    for name, (gib, priority) in POOLS.items():
        apply(crds, shared_pool(name, gib, priority), namespace)
    wanted = {name: (1, gib * GI, priority) for name, (gib, priority) in POOLS.items()}
    converge(sim, wanted, timeout=90)
    # Traffic on a few, then churn: a pool goes, one comes, one wants both hosts.
    for name in ("p01", "p04"):
        sim.touch(name)
    REPLICAS["p11"] = 0  # its unload is its deletion's, no eviction
    crds.kubectl("delete", "modelpool", "p11", "-n", namespace, "--wait=false")
    apply(crds, shared_pool("p12", 3, 2), namespace)
    PRIORITY.update(p12=2, p00=2)
    DECLARED.update(p12=3 * GI, p00=3 * GI)
    REPLICAS["p00"] = 2
    apply(crds, shared_pool("p00", 3, 2, replicas=2), namespace)
    wanted = {**wanted, "p12": (1, 3 * GI, 2), "p00": (2, 3 * GI, 2)}
    del wanted["p11"]
    converge(sim, wanted, timeout=60)
    audit = sim.audit
    assert audit.violations == [], "\n".join(audit.violations)
    assert audit.wrong_evictions() == [], "\n".join(map(str, audit.evictions))
    assert audit.transitions > 0 and audit.calls.get("load", 0) >= 8
    assert sim.errors == [] or len(sim.errors) < 3, sim.errors


def test_a_host_pod_of_two_gpus_places_models_on_both_without_over_committing_either(
    crds: Cluster, audited: tuple[str, HostSim]
) -> None:
    """Five 1 Gi pools on one host pod of two 3 Gi GPUs: each model takes 1.5 Gi with its process's
    overhead (512 MiB), so a device holds two awake; the fifth makes room by sleeping idle ones on the
    device it goes to. With every model on device 0 (a one-device ledger), the third load would be refused.
    (Its own operator and audit: the simulated hosts' ``wrongly_short`` knows no ModelHost apart.)"""
    namespace, sim = audited
    host = {"replicas": 1, "gpusPerHost": 2, "deviceMemory": "3Gi", "hostMemory": "4Gi"}
    apply(crds, host_manifest("gpus", **host, **KWOK_GPU_PLACEMENT), namespace)
    pools = [f"d{i}" for i in range(5)]
    for name in pools:
        apply(crds, shared_pool(name, 1, 0), namespace)
    converge(sim, {name: (1, GI, 0) for name in pools}, timeout=60)
    [pod] = sim.hosts.values()
    assert pod.devices == 2
    with pod.lock:
        devices = {name: model.device for name, model in pod.models.items()}
    assert sorted(devices) == pools and set(devices.values()) == {0, 1}, devices
    assert sim.audit.violations == [], "\n".join(sim.audit.violations)

    def status_devices() -> list[dict[str, Any]]:
        out = crds.kubectl("get", "modelhost", "gpus", "-n", namespace, "-o", "json").stdout
        hosts = json.loads(out).get("status", {}).get("hosts") or [{}]
        models = {m["pool"]: m.get("device") for m in hosts[0].get("models") or []}
        return list(hosts[0].get("devices") or []) if models == devices else []

    # The ModelHost's status: each device's ledger, each model on the device its host reports.
    wait_for(lambda: len(status_devices()) == 2, timeout=30, interval=0.5, message="status per device")
    for device in status_devices():
        assert device["capacityBytes"] == 3 * GI and 0 <= device["freeBytes"] <= 3 * GI, device

    def pool_devices() -> dict[str, list[int | None]]:
        out = crds.kubectl("get", "modelpools", "-n", namespace, "-o", "json").stdout
        return {
            pool["metadata"]["name"]: [
                w.get("device") for w in (pool.get("status") or {}).get("workers") or []
            ]
            for pool in json.loads(out)["items"]
        }

    # Each pool's status names the device of its replica.
    wanted = {name: [device] for name, device in devices.items()}
    wait_for(lambda: pool_devices() == wanted, timeout=30, interval=0.5, message="workers[].device")
