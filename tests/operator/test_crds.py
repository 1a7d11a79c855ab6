"""The checked-in CRDs are generated from the pydantic models, structural, documented and validating."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from modelpool_contract.api import (
    MSG_ADAPTER_POOL_NAME,
    MSG_ADAPTER_SERVED_NAME,
    MSG_ADAPTER_SOURCE,
    MSG_ADAPTER_TASK,
    MSG_ADAPTER_UNIQUE,
    MSG_DEVICE_MEMORY_POSITIVE,
    MSG_DEVICE_MEMORY_REQUIRED,
    MSG_INFERENCE_POOL_TASK,
    MSG_MIN_LE_REPLICAS,
    MSG_REPLICAS_LE_MAX,
    MSG_TARGET_LE_CAPACITY,
    SHARED_POOL_RULES,
)
from modelpool_contract.tasks import TASK_NAMES
from modelpool_operator import crdgen

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "crds" / name).read_text())
    assert isinstance(data, dict)
    return data


def schema(name: str) -> dict[str, Any]:
    root = load(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert isinstance(root, dict)
    return root


def walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, child in (node.get("properties") or {}).items():
            yield from walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            yield from walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_checked_in_crds_are_up_to_date() -> None:
    problems = crdgen.check(ROOT)
    assert not problems, "crds/ are out of date; run `make crds`:\n" + "".join(problems)[:4000]


def test_check_command_fails_on_a_stale_file(tmp_path: Path) -> None:
    crdgen.write(tmp_path)
    stale = tmp_path / "crds" / "modelpools.yaml"
    stale.write_text(stale.read_text().replace("Workers wanted", "Workers desired"))
    result = subprocess.run(
        [sys.executable, "-m", "modelpool_operator.crdgen", "--check", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}", "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert result.returncode == 1
    assert "make crds" in result.stderr and "Workers desired" in result.stderr


def test_structural_and_documented() -> None:
    for name in ("modelpools.yaml", "modelbudgets.yaml", "modelhosts.yaml"):
        for path, node in walk(schema(name)):
            assert "$ref" not in node and "title" not in node and "allOf" not in node, path
            if "anyOf" in node:
                # The only union left is the int-or-string quantity.
                assert node.get("x-kubernetes-int-or-string") is True, path
                assert all(b.get("type") in ("integer", "string") for b in node["anyOf"]), path
            else:
                assert node.get("type") in ("object", "string", "integer", "number", "boolean", "array"), path
            # Every named field is documented (map values and list items are described by their field).
            if path and path != ".metadata" and not path.endswith(("{}", "[]")):
                assert node.get("description"), f"{name}: {path} has no description (kubectl explain)"


def test_modelpool_validation_rules() -> None:
    root = schema("modelpools.yaml")
    spec = root["properties"]["spec"]
    messages = [v["message"] for v in spec["x-kubernetes-validations"]]
    shared = [message for _, _, message in SHARED_POOL_RULES]
    own = [MSG_MIN_LE_REPLICAS, MSG_REPLICAS_LE_MAX, MSG_TARGET_LE_CAPACITY, MSG_INFERENCE_POOL_TASK]
    adapters = [MSG_ADAPTER_TASK, MSG_ADAPTER_UNIQUE, MSG_ADAPTER_SERVED_NAME]
    assert messages == [*own, *shared, *adapters]
    # Each shared-pool rule applies only with spec.host and names its own field.
    rules = spec["x-kubernetes-validations"][len(own) : len(own) + len(shared)]
    for rule, (field, _, _) in zip(rules, SHARED_POOL_RULES, strict=True):
        assert rule["rule"].startswith("!has(self.host) || ") and rule["fieldPath"] == f".{field}"
    # The adapter named as its pool: a root rule (only there may CEL read metadata.name).
    assert [v["message"] for v in root["x-kubernetes-validations"]] == [MSG_ADAPTER_POOL_NAME]
    adapter = spec["properties"]["adapters"]["items"]["properties"]
    assert adapter["source"]["x-kubernetes-validations"][0]["message"] == MSG_ADAPTER_SOURCE
    model = spec["properties"]["model"]["properties"]
    assert model["task"]["enum"] == list(TASK_NAMES)
    assert "hf://" in model["source"]["x-kubernetes-validations"][0]["message"]
    memory = spec["properties"]["resources"]["properties"]["memory"]
    assert memory["x-kubernetes-int-or-string"] is True and memory["pattern"].startswith("^")
    assert set(spec["required"]) == {"model", "resources"}
    queue = spec["properties"]["queue"]["properties"]
    assert set(queue) == {"capacity", "maxBatchSize", "maxBatchDelayMs", "requestTimeoutSeconds"}
    assert queue["requestTimeoutSeconds"]["exclusiveMinimum"] is True


def test_names_columns_and_subresources() -> None:
    pool = load("modelpools.yaml")
    assert pool["metadata"]["name"] == "modelpools.modelpool.dev"
    assert pool["spec"]["scope"] == "Namespaced" and pool["spec"]["names"]["shortNames"] == ["mp"]
    version = pool["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Task",
        "Ready",
        "Desired",
        "State",
        "Memory",
        "Age",
    ]
    # `kubectl get modelpools -o wide`: declared against measured memory.
    wide = {c["name"]: c["jsonPath"] for c in columns if c.get("priority") == 1}
    assert wide["Declared"] == ".status.memory.declared"
    assert wide["Measured"] == ".status.memory.measuredPeak"
    assert wide["Tokens"] == ".status.generation.tokensInFlight"
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"

    budget = load("modelbudgets.yaml")
    assert budget["spec"]["scope"] == "Cluster" and budget["spec"]["names"]["shortNames"] == ["mb"]
    version = budget["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Total", "Used", "Reserved", "Age"]
    assert version["subresources"] == {"status": {}}


def test_status_schema_has_no_defaults() -> None:
    # Defaults in a status schema would be written back on every read; the operator owns status.
    for name in ("modelpools.yaml", "modelbudgets.yaml", "modelhosts.yaml"):
        for path, node in walk(schema(name)["properties"]["status"]):
            assert "default" not in node, path


def test_modelhost_schema_rules_and_columns() -> None:
    crd = load("modelhosts.yaml")
    assert crd["spec"]["scope"] == "Namespaced" and crd["spec"]["names"]["shortNames"] == ["mh"]
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # deviceMemory is refused by CEL when absent (an actionable message, not a bare "Required value").
    assert "required" not in spec
    assert [v["message"] for v in spec["x-kubernetes-validations"]] == [
        MSG_DEVICE_MEMORY_REQUIRED,
        MSG_DEVICE_MEMORY_POSITIVE,
    ]
    assert {"replicas", "gpusPerHost", "deviceMemory", "hostMemory", "image", "nodeSelector"} <= set(
        spec["properties"]
    )
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if not c.get("priority")}
    assert columns["Awake"] == ".status.memory.awake" and columns["Free"] == ".status.memory.free"
    assert columns["Asleep"] == ".status.memory.asleep"
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
