"""The ModelHost CRD and a ModelPool's spec.host on the real kube-apiserver: a bad ModelHost, and a shared
pool that sets a field its host owns, are refused naming the field with a message that says what to do;
good ones are accepted with their defaults; the printer columns show the hosts' GPU memory awake, asleep
and free."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelpool_contract.api import (
    MODELHOST_MAX_GPUS_PER_HOST,
    MODELHOST_NAME_MAX_LENGTH,
    MSG_DEVICE_MEMORY_POSITIVE,
    MSG_DEVICE_MEMORY_REQUIRED,
    MSG_HOST_NAME_LENGTH,
    SHARED_POOL_RULES,
    parse_pool_spec,
)
from testkit.cluster import Cluster
from testkit.kubectl import wait_established
from testkit.services import host_manifest

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def hosts_crd(crds: Cluster) -> Cluster:
    """The CRDs of crds/ (applied by ``crds``), the ModelHost's established too."""
    wait_established(crds, "modelhosts.modelpool.dev")
    return crds


def shared_pool(name: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"source": "/models/minilm", "task": "text-embedding"},
        "resources": {"memory": "2Gi"},
        "host": "gpus",
    }
    spec.update(overrides)
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name},
        "spec": spec,
    }


def dry_run(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> tuple[int, str]:
    # --dry-run=server: the API server validates (schema, CEL) without storing anything.
    done = cluster.kubectl(
        "apply", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
        input=json.dumps(manifest), check=False,
    )  # fmt: skip
    return done.returncode, done.stderr + done.stdout


# The message of each shared-pool rule, by the field it names.
SHARED = {field: message for field, _, message in SHARED_POOL_RULES}


REFUSED: list[tuple[str, dict[str, Any], list[str]]] = [
    ("no deviceMemory", host_manifest("h", gpusPerHost=1), ["spec.deviceMemory", MSG_DEVICE_MEMORY_REQUIRED]),
    (
        "deviceMemory 0",
        host_manifest("h", gpusPerHost=1, deviceMemory="0"),
        ["spec.deviceMemory", MSG_DEVICE_MEMORY_POSITIVE],
    ),
    ("not a quantity", host_manifest("h", deviceMemory="lots"), ["spec.deviceMemory"]),
    (
        "too many GPUs",
        host_manifest("h", deviceMemory="8Gi", gpusPerHost=MODELHOST_MAX_GPUS_PER_HOST + 1),
        ["spec.gpusPerHost"],
    ),
    ("negative hostMemory", host_manifest("h", deviceMemory="8Gi", hostMemory="-1Gi"), ["spec.hostMemory"]),
    (
        "negative modelOverhead",
        host_manifest("h", deviceMemory="8Gi", modelOverhead="-1Mi"),
        ["spec.modelOverhead"],
    ),
    (
        "negative integer modelOverhead",
        host_manifest("h", deviceMemory="8Gi", modelOverhead=-1),
        ["spec.modelOverhead"],
    ),
    # Its host pods carry the name in the label modelpool.dev/pool=host_<name>: 63 characters at most.
    (
        "name too long",
        host_manifest("h" * (MODELHOST_NAME_MAX_LENGTH + 1), deviceMemory="8Gi"),
        [MSG_HOST_NAME_LENGTH],
    ),
    ("not a name", shared_pool("p", host="Not_A_Name"), ["spec.host"]),
    (
        "shared pool gpus",
        shared_pool("p", resources={"memory": "2Gi", "gpus": 1}),
        [SHARED["resources.gpus"]],
    ),
    ("shared pool image", shared_pool("p", image="ghcr.io/x/y:1"), ["spec.image", SHARED["image"]]),
    (
        "shared pool podTemplate",
        shared_pool("p", podTemplate={"nodeSelector": {"a": "b"}}),
        [SHARED["podTemplate"]],
    ),
]


def test_bad_hosts_and_shared_pools_are_refused_naming_the_field(hosts_crd: Cluster, namespace: str) -> None:
    # One test over the cases: they share one namespace (each costs a dry-run request, not a namespace).
    for case, manifest, needles in REFUSED:
        code, output = dry_run(hosts_crd, namespace, manifest)
        assert code != 0, f"{case}: accepted\n{output}"
        missing = [needle for needle in needles if needle not in output]
        assert not missing, f"{case}: {missing} not in\n{output}"


def test_good_hosts_and_shared_pools_are_accepted_and_the_columns_show_memory(
    hosts_crd: Cluster, namespace: str
) -> None:
    # A CPU host with its defaults; a dedicated pool is untouched by the shared-pool rules.
    code, output = dry_run(hosts_crd, namespace, host_manifest("cpu", deviceMemory="16Gi"))
    assert code == 0, output
    spec = json.loads(output)["spec"]
    assert spec["replicas"] == 1 and spec["gpusPerHost"] == 0
    longest = host_manifest("h" * MODELHOST_NAME_MAX_LENGTH, deviceMemory="16Gi")
    code, output = dry_run(hosts_crd, namespace, longest)
    assert code == 0, output
    dedicated = shared_pool("dedicated", image="ghcr.io/x/y:1")
    del dedicated["spec"]["host"]
    code, output = dry_run(hosts_crd, namespace, dedicated)
    assert code == 0, output
    code, output = dry_run(
        hosts_crd, namespace, shared_pool("shared", resources={"memory": "2Gi", "gpus": 0})
    )
    assert code == 0, output
    # As a client that writes the model's defaults sends it (podTemplate with empty maps and lists).
    written = shared_pool("written")
    written["spec"] = parse_pool_spec(written["spec"]).wire()
    assert written["spec"]["podTemplate"]["nodeSelector"] == {}
    code, output = dry_run(hosts_crd, namespace, written)
    assert code == 0, output

    gpus = host_manifest(
        "gpus", replicas=2, gpusPerHost=2, deviceMemory="80Gi", hostMemory="64Gi", modelOverhead="500Mi",
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}], resources={"cpu": "8"},
    )  # fmt: skip
    hosts_crd.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(gpus))
    status = {
        "status": {
            "readyText": "2/2",
            "models": 5,
            "memory": {"awake": "90Gi", "asleep": "30Gi", "overhead": "2500Mi", "free": "227556Mi"},
        }
    }
    hosts_crd.kubectl(
        "patch", "modelhost/gpus", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    table = hosts_crd.kubectl("get", "mh", "gpus", "-n", namespace).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "READY",
        "GPUS",
        "MODELS",
        "AWAKE",
        "ASLEEP",
        "OVERHEAD",
        "FREE",
        "AGE",
    ]
    assert table[1].split()[:8] == ["gpus", "2/2", "2", "5", "90Gi", "30Gi", "2500Mi", "227556Mi"]
    wide = hosts_crd.kubectl("get", "mh", "gpus", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["DEVICE-MEMORY", "HOST-MEMORY", "MODEL-OVERHEAD"]
    assert wide[1].split()[-3:] == ["80Gi", "64Gi", "500Mi"]
    explained = hosts_crd.kubectl("explain", "modelhost.spec").stdout
    for field in (
        "deviceMemory",
        "hostMemory",
        "modelOverhead",
        "gpusPerHost",
        "nodeSelector",
        "tolerations",
    ):
        assert field in explained, explained
