"""The contract between the operator and the server (``modelpool_contract``; docs/design.md, "Contracts"):
both halves use it, and what one side writes the other reads back.

The operator never imports the model server (it would pull torch and the task modules into the operator
image) and the server never imports Kopf; the contract package imports neither.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_server.config import ServerConfig, load_config
from model_server.engine.download import DownloadProgress
from model_server.engine.inference_process import publish_download
from model_server.engine.sources import resolve
from model_server.frontend.server import ModelServer
from model_server.state_machine import SERVING, State
from model_server.tasks import REGISTRY
from modelpool_contract.api import API_VERSION, MODELPOOL_KIND, ModelSpec, WorkerStatus
from modelpool_contract.demand import LABEL_DEMAND, Demand, Share, demand_lease, renew, replica_id
from modelpool_contract.exits import EXIT_LOAD_FAILED
from modelpool_contract.flags import ServerArgs
from modelpool_contract.labels import LABEL_POOL
from modelpool_contract.mounts import PVC_MOUNT_ROOT, PvcSource, PvcSourceError, parse_pvc_source
from modelpool_contract.states import SERVING_STATES, WORKER_STATES
from modelpool_contract.stats import HostStats, WorkerStats
from modelpool_contract.tasks import TASK_NAMES, TaskName
from modelpool_gateway.state import pool_from_object
from modelpool_operator.effects.resources import PodSettings, build_worker_pod, server_args
from modelpool_operator.observe.worker_state import observe_worker
from modelpool_operator.pool import PoolView

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _pool_body(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "emb", "namespace": "ns", "uid": "u-1", "annotations": annotations or {}},
        "spec": {
            "model": {"source": "/models/m", "task": "text-embedding", "dtype": "float32"},
            "resources": {"memory": "1Gi"},
            "queue": {"capacity": 7, "requestTimeoutSeconds": 12.5},
            "idleTimeoutSeconds": 0,
        },
    }


def _pool() -> PoolView:
    return PoolView.from_body(_pool_body())


def _running(pod: dict[str, Any], **container: Any) -> dict[str, Any]:
    status = {"name": "server", "ready": False, "state": {"running": {"startedAt": "2026-01-01T11:00:00Z"}}}
    pod["status"] = {"phase": "Running", "containerStatuses": [{**status, **container}]}
    return pod


def test_the_contract_imports_neither_half_nor_torch_nor_kopf() -> None:
    code = (
        "import sys, modelpool_contract\n"
        "heavy = {'torch', 'kopf', 'numpy', 'model_server', 'modelpool_operator'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_task_names_are_the_servers_tasks_and_the_pool_specs_enum() -> None:
    assert set(REGISTRY) == set(TASK_NAMES)
    assert get_args(ModelSpec.model_fields["task"].annotation) == get_args(TaskName)
    assert get_args(ServerConfig.model_fields["task"].annotation) == get_args(TaskName)


def test_worker_states_are_the_servers_states_and_the_status_enum() -> None:
    assert tuple(state.value for state in State) == WORKER_STATES
    assert get_args(WorkerStatus.model_fields["state"].annotation) == WORKER_STATES
    assert {state.value for state in SERVING} == SERVING_STATES


def test_the_stats_document_the_server_emits_is_what_the_operator_parses() -> None:
    server = ModelServer(load_config(["--model", "/models/m", "--task", "text-embedding"]))
    server.state_machine.to(State.LOADING)
    server.state_machine.to(State.READY)
    server.state_machine.to(State.IDLE)
    document = server.stats()
    assert set(document) == set(WorkerStats.model_fields)
    parsed = WorkerStats.parse(document)
    assert parsed is not None and parsed.wire() == document
    worker = observe_worker(_running(build_worker_pod(_pool(), "emb-h-0")), document, NOW)
    assert worker.state == "Idle" and worker.stats_known and worker.queue_depth == 0


@pytest.mark.parametrize("body", [None, [], "Idle", {"state": 5, "queue_depth": "x", "memory": 1}])
def test_an_odd_stats_document_is_unknown_never_an_error(body: Any) -> None:
    parsed = WorkerStats.parse(body)
    assert parsed is None or (parsed.state, parsed.queue_depth, parsed.memory) == (None, None, None)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(
    body=_JSON
    | st.fixed_dictionaries(
        {},
        optional={
            "host": _JSON | st.fixed_dictionaries({}, optional={"devices": _JSON, "failed": _JSON}),
            "models": st.dictionaries(st.text(max_size=4), _JSON, max_size=3),
        },
    )
)
def test_an_odd_host_stats_document_is_read_as_far_as_it_goes_never_an_error(body: Any) -> None:
    """A shared host's ``/stats`` (``HostStats.parse``, the operator's one reader of it) never raises: what
    cannot be read is unknown or left out."""
    parsed = HostStats.parse(body)
    assert parsed is None or all(isinstance(name, str) for name in parsed.models)


def test_the_host_stats_document_the_host_emits_is_what_the_operator_parses() -> None:
    from model_server.host_config import HostConfig
    from model_server.supervisor.host import HostSupervisor

    host = HostSupervisor(HostConfig(device_memory="1Gi", max_models=1, gpus=1))  # type: ignore[arg-type]
    document = host.stats()
    parsed = HostStats.parse(document)
    assert parsed is not None and parsed.wire() == document
    assert [d.capacity for d in parsed.host.devices] == [1 << 30] and parsed.models == {}


def test_the_flags_the_operator_passes_are_server_flags_with_the_same_defaults() -> None:
    fields = set(ServerArgs.__dataclass_fields__)
    assert fields <= set(ServerConfig.model_fields)
    required = {"model": "/m", "task": "vision", "name": "x"}
    server = load_config(ServerArgs(**required).argv())  # type: ignore[arg-type]
    for name in fields - set(required) - {"port"}:  # the port: the operator's choice for pods
        sent = getattr(ServerArgs(**required), name)  # type: ignore[arg-type]
        if sent is not None:  # an optional flag left out: the server's own default applies
            assert getattr(server, name) == sent, name
    assert server.pvc_root == Path(PVC_MOUNT_ROOT)  # and that one is the contract's


def test_a_pvc_source_is_read_where_the_operator_mounts_its_claim(tmp_path: Path) -> None:
    body = {
        "metadata": {"name": "emb", "namespace": "ns"},
        "spec": {
            "model": {"source": "pvc://weights/minilm/v1", "task": "text-embedding"},
            "resources": {"memory": "1Gi"},
        },
    }
    (container,) = build_worker_pod(PoolView.from_body(body), "emb-h-0")["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models/weights", "readOnly": True}
    config = load_config(container["args"])
    # The claim's files where the pod sees them (below tmp_path, as the process node puts a pod's root).
    model_dir = tmp_path / mount["mountPath"].lstrip("/") / "minilm" / "v1"
    model_dir.mkdir(parents=True)
    root = tmp_path / str(config.pvc_root).lstrip("/")
    assert resolve(config.model, pvc_root=root) == model_dir


def test_pvc_sources_parse_to_a_claim_and_a_path_inside_it() -> None:
    source = parse_pvc_source("pvc://weights//minilm/v1/")
    assert source == PvcSource(claim="weights", path="minilm/v1")
    assert (source.mount_path, source.model_path()) == ("/models/weights", "/models/weights/minilm/v1")
    assert PvcSource("weights", "").model_path("/r/") == "/r/weights"
    assert parse_pvc_source("hf://org/m") is None and parse_pvc_source("/models/x") is None
    for bad in ("pvc://", "pvc:///x", "pvc://Weights/x", "pvc://w/../other", "pvc://-w"):
        with pytest.raises(PvcSourceError):
            parse_pvc_source(bad)


def test_download_progress_reaches_the_pool_status_while_loading() -> None:
    server = ModelServer(load_config(["--model", "hf://org/m", "--task", "text-embedding"]))
    progress = DownloadProgress()  # the inference process's, published into the shared view
    publish_download(server.view, progress)
    server.state_machine.to(State.LOADING)
    pod = _running(build_worker_pod(_pool(), "emb-h-0"))
    unlisted = observe_worker(pod, server.stats(), NOW).to_status().wire()
    assert "downloadedBytes" not in unlisted  # not before the hub listed the files
    progress.downloaded_bytes, progress.total_bytes = 300, 1000
    publish_download(server.view, progress)
    status = observe_worker(pod, server.stats(), NOW).to_status().wire()
    assert (status["downloadedBytes"], status["downloadTotalBytes"]) == (300, 1000)
    server.state_machine.to(State.READY)
    ready = observe_worker(_running(pod, ready=True), server.stats(), NOW).to_status().wire()
    assert "downloadedBytes" not in ready  # shown while Loading only


def test_the_server_reads_back_what_the_pod_builder_writes() -> None:
    pool = _pool()
    config = load_config(server_args(pool.name, pool.spec, PodSettings()))
    assert (config.model, config.task, config.served_name) == ("/models/m", "text-embedding", "emb")
    assert (config.queue_capacity, config.request_timeout, config.dtype) == (7, 12.5, "float32")


def test_the_load_failure_exit_code_reads_as_load_failed() -> None:
    terminated = {"terminated": {"exitCode": EXIT_LOAD_FAILED, "reason": "Error", "message": "no weights"}}
    worker = observe_worker(_running(build_worker_pod(_pool(), "emb-h-0"), state=terminated), None, NOW)
    assert (worker.state, worker.reason, worker.message) == ("Failed", "LoadFailed", "no weights")


def test_the_labels_the_pod_builder_writes_are_the_ones_observation_reads() -> None:
    pool = _pool()
    worker = observe_worker(_running(build_worker_pod(pool, "emb-h-0"), ready=True), None, NOW)
    assert (worker.pool, worker.template_hash, worker.serving) == ("emb", pool.template_hash, True)
    assert worker.requested_memory == 2**30


def test_the_demand_a_gateway_records_is_what_the_operator_reads() -> None:
    """A gateway creates, then renews, the pool's demand Lease (``modelpool_contract.demand``); the operator's
    index of demand Leases and its view of the pool carry its renewTime, to the microsecond, and each
    gateway replica's share: the requests it held and refused (hold full), summed while live."""
    from modelpool_operator.reconcile import latest_demand
    from tests.operator.unit.op_handlers import demand_by_pool

    first, later = NOW.replace(microsecond=250_123), NOW.replace(second=5, microsecond=7)
    lease = demand_lease(
        pool="emb",
        pool_uid="u-1",
        moment=first,
        holder="gw-a",
        duration_s=6,
        pool_api_version=API_VERSION,
        pool_kind=MODELPOOL_KIND,
        held=4,
        refused=9,
    )
    assert lease["spec"]["renewTime"] == "2026-01-01T12:00:00.250123Z"
    assert lease["metadata"]["labels"] == {LABEL_POOL: "emb", LABEL_DEMAND: "true"}
    owner = lease["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner.get("blockOwnerDeletion")) == ("ModelPool", "u-1", None)
    share = Share(replica_id("gw-a"), first, 4, 9)
    assert asyncio.run(demand_by_pool(namespace="ns", body=lease)) == {
        ("ns", "emb"): Demand(first, 6, (share,))
    }
    renewed = renew(lease, moment=later, holder="gw-b", duration_s=6, held=2, refused=1)
    assert renewed["metadata"]["ownerReferences"] == lease["metadata"]["ownerReferences"]
    assert renewed["spec"]["holderIdentity"] == "gw-b"
    index = {("ns", "emb"): [asyncio.run(demand_by_pool(namespace="ns", body=renewed))[("ns", "emb")]]}
    pool = PoolView.from_body(_pool_body(), demand=latest_demand(index, ("ns", "emb")))
    assert pool.demanded_at == later and pool.demand is not None and pool.demand.held_at(later) == 2 + 4
    assert pool.demand.refused_at(later) == 1 + 9  # both replicas' shares are live
    late = first + timedelta(seconds=6.5)  # gw-a's share (duration 6 s) no longer counts
    assert (pool.demand.held_at(late), pool.demand.refused_at(late)) == (2, 1)
    assert latest_demand(index, ("ns", "other")) is None
    # A Lease without the demand label is not one (the index leaves it out).
    del lease["metadata"]["labels"][LABEL_DEMAND]
    assert asyncio.run(demand_by_pool(namespace="ns", body=lease)) == {}


def test_the_gateway_reads_a_pool_with_the_operators_models() -> None:
    """One definition of the API: the gateway's pool view comes from ``modelpool_contract.api``, as the
    operator's does; the defaults it holds a request with are the spec's."""
    body = _pool_body()
    body["spec"]["servedModelName"] = "org/emb"
    gateway, operator = pool_from_object(body), PoolView.from_body(body)
    assert gateway.served_model_name == operator.spec.served_model_name == "org/emb"
    assert gateway.activation_timeout_s == operator.spec.activation_timeout_seconds
    assert gateway.task == operator.spec.model.task and gateway.uid == operator.uid == "u-1"
    assert gateway.invalid is None


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"replicas": 0, "maxReplicas": 4},
        {"replicas": 0, "maxReplicas": 4, "autoscaling": {"enabled": False}},
        {"replicas": 2, "minReplicas": 2, "maxReplicas": 2},
        {"replicas": 0, "minReplicas": 0, "maxReplicas": 1, "autoscaling": {"enabled": True}},
    ],
)
def test_the_gateway_knows_which_pools_the_operator_wakes_from_zero(spec: dict[str, Any]) -> None:
    """The operator's planner wakes a pool at zero for fresh demand exactly when the gateway says it will."""
    from modelpool_operator.budget import build_ledger
    from modelpool_operator.planner.autoscale import wake_on_demand
    from modelpool_operator.planner.draft import Draft

    body = _pool_body()
    body["spec"] = {
        "model": {"source": "/m", "task": "text-embedding"},
        "resources": {"memory": "1Gi"},
        **spec,
    }
    # Created a minute before the demand, at zero since.
    body["metadata"]["creationTimestamp"] = "2026-01-01T11:59:00Z"
    draft = Draft(PoolView.from_body(body, demand=Demand(NOW)), [], build_ledger(None, [], ()), NOW)
    draft.target = 0
    wake_on_demand(draft)
    assert pool_from_object(body).wakes_on_demand is (draft.target == 1)


def test_the_gateway_imports_neither_half_nor_torch_nor_kopf() -> None:
    """The gateway ships in the operator image without torch and runs without the operator's kopf."""
    code = (
        "import sys, modelpool_gateway.main, modelpool_gateway.app\n"
        "heavy = {'torch', 'kopf', 'model_server', 'modelpool_operator'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("gpus", [0, 2])
def test_the_host_pods_command_line_is_what_the_shared_host_reads(gpus: int, tmp_path: Path) -> None:
    """The operator's ``modelpool-server --shared-host`` flags (``build_host_pod``) load into the host's
    settings with the ModelHost's figures (the control key file as mounted: here a file of the test's)."""
    from model_server.host_config import load_host_config
    from modelpool_contract.api import parse_host_spec
    from modelpool_operator.effects.resources import CONTROL_KEY_FILE, build_host_pod
    from modelpool_operator.host import HostView

    spec = parse_host_spec({"gpusPerHost": gpus, "deviceMemory": "4Gi", "hostMemory": "2Gi"})
    (container,) = build_host_pod(HostView("ns", "h", spec), 0, PodSettings())["spec"]["containers"]
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    args = [str(key) if a == CONTROL_KEY_FILE else a for a in container["args"]]
    config = load_host_config(args)
    assert config.shared_host and config.control_key == "s3cret"
    assert (config.device_memory, config.host_memory) == (4 * 1024**3, 2 * 1024**3)
    assert config.device == ("cpu" if gpus == 0 else "auto")
    assert (config.port, config.probe_port) == (PodSettings().port, PodSettings().probe_port)
