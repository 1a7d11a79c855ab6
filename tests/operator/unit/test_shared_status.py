"""A shared pool's status is the dedicated pool's typed ``ModelPoolStatus`` (``planner.shared.shared_status``,
``host_wait_status``), on the wire by one function (``shared_wire``): every field it writes is one the CRD's
status schema knows, with its type (nothing the API server would prune), and it reads back as written."""

from __future__ import annotations

from typing import Any

from modelpool_contract.api import ModelPoolStatus, parse_pool_status
from modelpool_operator.planner.shared import HostWait, host_wait_status, shared_status, shared_wire
from modelpool_operator.planner.shared_scale import scale_shared
from tests.operator.test_crds import schema
from tests.operator.unit.test_shared_scale import NOW, model_doc, observed, pool

_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def outside_schema(value: Any, node: dict[str, Any], path: str = "status") -> list[str]:
    """Where ``value`` leaves the structural schema ``node``: an unknown field, a wrong type or enum."""
    if isinstance(value, dict):
        if node.get("type") != "object":
            return [f"{path}: an object where {node.get('type')} is"]
        known = node.get("properties")
        if known is None:  # a free-form map
            return []
        found: list[str] = []
        for key, child in value.items():
            found += outside_schema(child, known[key], f"{path}.{key}") if key in known else [f"{path}.{key}"]
        return found
    if isinstance(value, list):
        if node.get("type") != "array":
            return [f"{path}: a list where {node.get('type')} is"]
        return [
            f for i, item in enumerate(value) for f in outside_schema(item, node["items"], f"{path}[{i}]")
        ]
    wanted = node.get("type")
    typed = _TYPES[type(value)]
    if typed != wanted and not (typed == "integer" and wanted == "number"):
        return [f"{path}: {typed} where {wanted} is"]
    return (
        [f"{path}: {value!r} not in {node['enum']}"] if "enum" in node and value not in node["enum"] else []
    )


def _status() -> ModelPoolStatus:
    """A shared pool of three replicas after a pass: one serving, one loading, one failed (its backoff)."""
    workers = observed(
        {
            "gpus-0": model_doc("Processing", in_flight=8, queue_depth=32, device=1),
            "gpus-1": model_doc("Loading"),
            "gpus-2": model_doc("Failed", reason="OOM"),
        }
    )
    scale = scale_shared(pool(replicas=2, maxReplicas=4), workers, host_pods=3, now=NOW)
    return shared_status(pool(replicas=2), workers, HostWait("NoRoom", "no device has 1Gi free"), NOW, scale)


def test_a_shared_pools_status_is_within_the_crd_schema_and_reads_back_as_written() -> None:
    status = _status()
    wire = shared_wire(status)
    root = schema("modelpools.yaml")["properties"]["status"]
    assert outside_schema(wire, root) == []
    assert parse_pool_status(wire) == status
    # The fields a shared pool's status always carried, and the memory the budget does not wait for.
    assert set(wire) == {
        "phase", "observedGeneration", "replicas", "readyReplicas", "targetReplicas", "specReplicas",
        "readyText", "workers", "memory", "conditions", "backoff", "autoscaling",
    }  # fmt: skip
    assert wire["memory"] == {"charged": "0", "chargedBytes": 0, "waitingBytes": 0, "declared": "1Gi"}
    assert [(w["name"], w["host"], w["state"]) for w in wire["workers"]] == [
        ("gpus-0", "gpus-0", "Processing"),
        ("gpus-1", "gpus-1", "Loading"),
        ("gpus-2", "gpus-2", "Failed"),
    ]
    assert wire["backoff"]["failures"] == 1 and wire["phase"] == "Degraded"


def test_a_waiting_shared_pools_status_is_a_patch_of_the_fields_it_sets() -> None:
    earlier = shared_wire(_status())
    waiting = shared_wire(
        host_wait_status(pool(earlier), HostWait("HostNotFound", "no ModelHost"), NOW), patch=True
    )
    assert set(waiting) == {
        "phase",
        "observedGeneration",
        "replicas",
        "readyReplicas",
        "readyText",
        "conditions",
    }
    assert outside_schema(waiting, schema("modelpools.yaml")["properties"]["status"]) == []
    # The other conditions (ApiError, ...) are kept; Placed and Ready say why it waits.
    by_type = {c["type"]: c for c in waiting["conditions"]}
    assert (by_type["Placed"]["reason"], by_type["Ready"]["reason"]) == ("HostNotFound", "HostNotFound")
