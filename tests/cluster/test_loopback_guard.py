"""The loopback guard (testkit/loopback.py): every pod IP the local cluster assigns lies in 127.0.0.0/8.

The decision is tested on its own (which addresses count, what the report names), then the command line
that `make demo` uses, then the session guard on the real cluster: a pod on a KWOK node gets an address in
its node's loopback pod CIDR, and the session's watch records it.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import apply, get_json, wait_for
from testkit.loopback import (
    PodIPRecord,
    is_loopback,
    pod_addresses,
    read_record,
    violation_report,
    violations,
)


@pytest.mark.parametrize(
    ("ip", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.64.0.7", True),
        ("127.255.255.254", True),
        ("10.64.0.1", False),  # the old KWOK pod CIDR: private, it may reach another machine
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("8.8.8.8", False),
        ("128.0.0.1", False),
        ("::1", False),  # loopback, but not 127.0.0.0/8: the guard holds the cluster to IPv4 loopback
        ("not-an-ip", False),
        ("", False),
    ],
)
def test_only_127_slash_8_is_loopback(ip: str, loopback: bool) -> None:
    assert is_loopback(ip) is loopback


def test_pod_addresses_reads_pod_ip_and_pod_ips() -> None:
    status = {"podIP": "127.64.0.2", "podIPs": [{"ip": "127.64.0.2"}, {"ip": "fd00::2"}]}
    assert pod_addresses(status) == {"127.64.0.2", "fd00::2"}
    assert pod_addresses({"phase": "Pending"}) == set()
    assert pod_addresses(None) == set()


def test_violations_name_each_pod_and_address_outside_loopback() -> None:
    seen = {"ns/ok": {"127.64.0.1"}, "ns/bad": {"10.66.0.1"}, "other/mixed": {"127.42.0.2", "fd00::5"}}
    bad = violations(seen)
    assert bad == ["ns/bad: 10.66.0.1", "other/mixed: fd00::5"]
    report = violation_report(bad)
    assert "ns/bad: 10.66.0.1" in report and "127.0.0.0/8" in report
    assert violations({"ns/ok": {"127.64.0.1"}}) == []


def test_record_keeps_every_address_once_and_round_trips_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "pod-ips.txt"
    with path.open("w") as sink:
        record = PodIPRecord(sink)
        record.add("ns/a", ["127.64.0.1"])
        record.add("ns/a", ["127.64.0.1"])  # seen again: not written twice
        record.add("ns/a", ["127.64.0.9"])  # a new address for the same pod (recreated): both kept
        record.add("ns/b", ["10.64.0.3"])
    assert path.read_text().splitlines() == ["ns/a 127.64.0.1", "ns/a 127.64.0.9", "ns/b 10.64.0.3"]
    assert (
        read_record(path)
        == record.snapshot()
        == {"ns/a": {"127.64.0.1", "127.64.0.9"}, "ns/b": {"10.64.0.3"}}
    )


def _check(record: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "testkit.loopback", "check", str(record)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_command_fails_naming_the_pod(tmp_path: Path) -> None:
    record = tmp_path / "pod-ips.txt"
    record.write_text("# listed\nns/good 127.64.0.1\nns/leaky 10.65.0.4\n")
    done = _check(record)
    assert done.returncode == 1
    assert "ns/leaky: 10.65.0.4" in done.stderr and "ns/good" not in done.stderr

    record.write_text("# listed\nns/good 127.64.0.1\nns/other 127.42.0.3\n")
    done = _check(record)
    assert done.returncode == 0, done.stderr
    assert "2 pods, 2 addresses, all inside 127.0.0.0/8" in done.stdout


@pytest.mark.cluster
def test_kwok_pods_get_loopback_addresses_and_the_session_guard_records_them(
    cluster: Cluster, namespace: str
) -> None:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kwok-pod"},
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [{"name": "c", "image": "fake"}],
        },
    }
    apply(cluster, pod, namespace)
    placed = wait_for(
        lambda: (
            get_json(cluster, "pod", "kwok-pod", "-n", namespace).get("status", {}).get("podIP")
            and get_json(cluster, "pod", "kwok-pod", "-n", namespace)
        ),
        timeout=60,
        message="KWOK pod gets an address",
    )
    ip = placed["status"]["podIP"]
    node = get_json(cluster, "node", placed["spec"]["nodeName"])
    cidr = node["spec"]["podCIDR"]  # 127.64.0.0/16 to 127.67.0.0/16 (hack/kwok/nodes.yaml)
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(cidr)
    assert is_loopback(ip), f"KWOK gave {ip}: its node's pod CIDR is {cidr}"

    for other in get_json(cluster, "nodes")["items"]:  # every node's pod CIDR, the process node's too
        for cidr in other["spec"].get("podCIDRs") or []:  # all inside 127.0.0.0/8
            network = ipaddress.ip_network(cidr)
            assert isinstance(network, ipaddress.IPv4Network), other
            assert network.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")), other

    guard = cluster.pod_ips
    assert guard is not None, "the session fixture runs the pod IP guard"
    key = f"{namespace}/kwok-pod"
    wait_for(
        lambda: ip in guard.record.snapshot().get(key, set()), timeout=30, message="guard records the pod"
    )
    assert not violations(guard.record.snapshot())
