"""The sample manifests in examples/ are valid against the API models (the same rules as the CRD schema),
and together cover every task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.helpers import EXAMPLES
from modelpool_contract.api import (
    API_VERSION,
    MODELBUDGET_KIND,
    MODELHOST_KIND,
    MODELPOOL_KIND,
    parse_budget_spec,
    parse_host_spec,
    parse_pool_spec,
    source_is_supported,
)
from modelpool_contract.mounts import parse_pvc_source
from modelpool_contract.tasks import TASK_NAMES
from modelpool_operator.effects.resources import build_worker_pod
from modelpool_operator.pool import PoolView

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_examples_exist() -> None:
    assert EXAMPLE_FILES, "examples/*.yaml is empty"


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_is_valid(path: Path) -> None:
    for doc in _documents(path):
        assert doc["apiVersion"] == API_VERSION
        spec = doc["spec"]
        if doc["kind"] == MODELPOOL_KIND:
            pool = parse_pool_spec(spec)
            assert source_is_supported(pool.model.source)
            assert pool.min_replicas <= pool.replicas <= pool.max_replicas
        elif doc["kind"] == MODELHOST_KIND:
            assert parse_host_spec(spec).device_memory_bytes > 0
        else:
            assert doc["kind"] == MODELBUDGET_KIND
            assert parse_budget_spec(spec).memory_bytes > 0


def test_examples_cover_every_task_with_unique_names() -> None:
    pools = [d for p in EXAMPLE_FILES for d in _documents(p) if d["kind"] == MODELPOOL_KIND]
    tasks = {parse_pool_spec(p["spec"]).model.task for p in pools}
    assert tasks == set(TASK_NAMES)
    names = [p["metadata"]["name"] for p in pools]
    assert len(names) == len(set(names)), f"duplicate pool names: {names}"


def test_pvc_examples_load_from_where_their_claim_is_mounted() -> None:
    pools = [d for p in EXAMPLE_FILES for d in _documents(p) if d["kind"] == MODELPOOL_KIND]
    pvc_pools = [p for p in pools if p["spec"]["model"]["source"].startswith("pvc://")]
    assert pvc_pools, "no example loads from a PersistentVolumeClaim"
    for doc in pvc_pools:
        source = parse_pvc_source(doc["spec"]["model"]["source"])
        assert source is not None
        pod = build_worker_pod(PoolView.from_body(doc), "w")
        (container,) = pod["spec"]["containers"]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == source.mount_path)
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["persistentVolumeClaim"]["claimName"] == source.claim
        root = container["args"][container["args"].index("--pvc-root") + 1]
        # The directory the server will read lies inside the mounted claim.
        assert source.model_path(root).startswith(mount["mountPath"] + "/"), doc["metadata"]["name"]


def test_every_dedicated_pool_and_host_asks_for_its_cpu() -> None:
    # Not the operator's default: an example says what its workers need (issue 29: workers sharing a node
    # without a CPU request each size their threads to every core of it).
    docs = [d for p in EXAMPLE_FILES for d in _documents(p)]
    pools = [d for d in docs if d["kind"] == MODELPOOL_KIND and not parse_pool_spec(d["spec"]).host]
    hosts = [d for d in docs if d["kind"] == MODELHOST_KIND]
    assert pools and hosts
    for doc in pools:
        assert parse_pool_spec(doc["spec"]).resources.cpu is not None, doc["metadata"]["name"]
        (container,) = build_worker_pod(PoolView.from_body(doc), "w")["spec"]["containers"]
        assert container["resources"]["requests"]["cpu"] == str(doc["spec"]["resources"]["cpu"])
    for doc in hosts:
        assert parse_host_spec(doc["spec"]).resources.cpu is not None, doc["metadata"]["name"]
