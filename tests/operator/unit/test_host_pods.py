"""A ModelHost's host pods (``effects.resources.build_host_pod``, ``build_control_key_secret``), its pass
(``planner.hosts.plan_host``: which pods to make and delete within the budget, the status) and the image
allowlist over its spec (``policy.host_violations``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from modelpool_contract.api import parse_host_spec
from modelpool_contract.flags import CPU_SHARE_ENV, DEFAULT_WORKER_CPU
from modelpool_contract.labels import ANNOTATION_MEMORY
from modelpool_contract.placements import LABEL_HOST
from modelpool_operator.budget import Ledger
from modelpool_operator.effects.resources import (
    CONTROL_KEY_FILE,
    PodSettings,
    build_control_key_secret,
    build_host_pod,
    host_pod_template_hash,
)
from modelpool_operator.host import HostView, host_charge_key, host_template_hash
from modelpool_operator.observe.hosts import observe_hosts
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner.hosts import plan_host
from modelpool_operator.policy import (
    FIELD_HOST_NODE_SELECTOR,
    FIELD_HOST_TOLERATIONS,
    FIELD_IMAGE,
    FIELD_NAMESPACE,
    Policy,
    Violation,
    host_violations,
    msg_node_selector,
    msg_operator_namespace,
    msg_toleration,
)

GI = 1024**3


def view(**spec: Any) -> HostView:
    base: dict[str, Any] = {"replicas": 2, "gpusPerHost": 1, "deviceMemory": "8Gi"}
    return HostView(namespace="ns", name="gpus", spec=parse_host_spec({**base, **spec}), uid="u-1")


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_a_gpu_host_pod_owns_its_gpus_and_runs_the_shared_host_with_its_control_key() -> None:
    host = view(
        gpusPerHost=2,
        hostMemory="64Gi",
        image="ghcr.io/x/server:1",
        nodeSelector={"gpu": "h100"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        resources={"cpu": "8"},
    )
    pod = build_host_pod(host, 1, PodSettings(port=9000, probe_port=9001))
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "gpus-1" and meta["namespace"] == "ns"
    assert meta["labels"][LABEL_HOST] == "gpus"
    # Watched and charged as workers are, under a name no ModelPool can have.
    assert meta["labels"]["modelpool.dev/pool"] == "host_gpus"
    assert meta["annotations"][ANNOTATION_MEMORY] == str(16 * GI)  # charged its whole devices
    assert (
        meta["ownerReferences"][0] | {"uid": "u-1", "kind": "ModelHost", "controller": True}
        == meta["ownerReferences"][0]
    )
    [container] = spec["containers"]
    args = container["args"]
    assert args[0] == "--shared-host"
    assert (flag(args, "--port"), flag(args, "--probe-port")) == ("9000", "9001")
    assert flag(args, "--device") == "auto" and flag(args, "--device-memory") == str(8 * GI)
    assert flag(args, "--gpus") == "2"  # two devices of --device-memory each: models on cuda:0 or cuda:1
    assert flag(args, "--host-memory") == str(64 * GI)
    assert flag(args, "--model-overhead") == str(512 * 2**20)  # the GPU default: a CUDA context per model
    assert flag(args, "--control-key-file") == CONTROL_KEY_FILE
    assert container["image"] == "ghcr.io/x/server:1"
    resources = container["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": "2"}
    assert resources["requests"] == {"nvidia.com/gpu": "2", "memory": str(64 * GI), "cpu": "8"}
    assert spec["nodeSelector"] == {"gpu": "h100"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    secret = next(v for v in spec["volumes"] if v["name"] == "control-key")["secret"]
    assert secret["secretName"] == "gpus-control-key"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "control-key")
    assert CONTROL_KEY_FILE.startswith(mount["mountPath"] + "/") and mount["readOnly"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["automountServiceAccountToken"] is False


def test_a_host_pods_log_format_is_the_operators_and_the_default_adds_no_flag() -> None:
    def args(settings: PodSettings) -> list[str]:
        container = build_host_pod(view(), 0, settings)["spec"]["containers"][0]
        return [*container.get("command", []), *container["args"]]

    assert "--log-format" not in args(PodSettings(log_format="json"))
    assert flag(args(PodSettings(log_format="plain")), "--log-format") == "plain"


def test_a_cpu_host_pod_asks_for_the_ram_its_models_use_and_park() -> None:
    host = view(gpusPerHost=0, deviceMemory="4Gi", hostMemory="2Gi")
    pod = build_host_pod(host, 0, PodSettings(default_cpu=None))
    [container] = pod["spec"]["containers"]
    assert flag(container["args"], "--device") == "cpu" and flag(container["args"], "--gpus") is None
    assert container["resources"]["requests"] == {"memory": str(6 * GI)}
    assert container["resources"]["limits"] == {"memory": str(6 * GI)}
    assert pod["metadata"]["annotations"][ANNOTATION_MEMORY] == str(6 * GI)
    no_sleep = build_host_pod(view(gpusPerHost=0, deviceMemory="4Gi"), 0)
    assert flag(no_sleep["spec"]["containers"][0]["args"], "--host-memory") is None
    # Idle models sleep only where there is RAM to park them in.
    assert "--sleep-idle" in container["args"]
    assert "--sleep-idle" not in no_sleep["spec"]["containers"][0]["args"]


def _cpu_and_share(pod: dict[str, Any]) -> tuple[str | None, str | None, list[str]]:
    """The host container's CPU request and limit, and the names of its CPU share variables."""
    [container] = pod["spec"]["containers"]
    share = [e["name"] for e in container["env"] if e["name"] == CPU_SHARE_ENV]
    resources = container["resources"]
    return resources["requests"].get("cpu"), resources["limits"].get("cpu"), share


def test_a_host_pod_without_resources_cpu_gets_the_default_request_its_models_share() -> None:
    for gpus in (0, 1):
        host = view(gpusPerHost=gpus, deviceMemory="4Gi")
        assert _cpu_and_share(build_host_pod(host, 0)) == (DEFAULT_WORKER_CPU, None, [CPU_SHARE_ENV])
        assert _cpu_and_share(build_host_pod(host, 0, PodSettings(default_cpu="3"))) == (
            "3",
            None,
            [CPU_SHARE_ENV],
        )
        assert _cpu_and_share(build_host_pod(host, 0, PodSettings(default_cpu=None))) == (None, None, [])
    # The ModelHost's own resources.cpu wins, with the default on or off.
    host = view(resources={"cpu": "8"})
    for default in ("3", None):
        assert _cpu_and_share(build_host_pod(host, 0, PodSettings(default_cpu=default))) == (
            "8",
            None,
            [CPU_SHARE_ENV],
        )


def test_the_control_key_secret_is_owned_by_the_modelhost() -> None:
    secret = build_control_key_secret(view(), "k3y")
    assert secret["metadata"]["name"] == "gpus-control-key"
    assert secret["stringData"] == {"key": "k3y"}
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "ModelHost"


def test_the_modelhosts_objects_carry_its_namespace_and_never_an_empty_one() -> None:
    """Built as a pool's objects are (``owned_metadata``): a ModelHost read without a namespace (a body
    from a file, before the API server fills it in) gives its pod and Secret no ``namespace: ""``."""
    bare = HostView.from_body({"metadata": {"name": "gpus", "uid": "u-1"}, "spec": {"deviceMemory": "8Gi"}})
    for built in (build_host_pod(bare, 0), build_control_key_secret(bare, "k3y")):
        assert "namespace" not in built["metadata"]
        assert built["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    for built in (build_host_pod(view(), 0), build_control_key_secret(view(), "k3y")):
        assert built["metadata"]["namespace"] == "ns"


CURRENT = host_template_hash(view().spec)


def pod(
    name: str, state: str = "Ready", *, ready: bool = True, template: str = CURRENT, deleting: bool = False
) -> tuple[ObservedWorker, dict[str, Any]]:
    worker = ObservedWorker(
        template_hash=template,
        name=name,
        namespace="ns",
        pool=host_charge_key("ns", "gpus")[1],
        state=state,
        memory=8 * GI,  # type: ignore[arg-type]
        deleting=deleting,
    )
    body = {
        "metadata": {"name": name},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    return worker, body


def plan(host: HostView, pods: list[tuple[ObservedWorker, dict[str, Any]]], total: int | None) -> Any:
    used = sum(w.memory for w, _ in pods if w.state not in ("Failed", "Dead"))
    ledger = Ledger(total=total, used=used, reserved=0)
    return plan_host(host, [w for w, _ in pods], observe_hosts(host.spec, [b for _, b in pods]), ledger)


def test_missing_host_pods_are_made_within_the_budget() -> None:
    assert plan(view(replicas=3), [], None).create == (0, 1, 2)
    limited = plan(view(replicas=3), [], 17 * GI)
    assert limited.create == (0, 1) and limited.short == 1
    assert plan(view(replicas=3), [pod("gpus-1")], 17 * GI).create == (0,)


def test_extra_failed_and_foreign_host_pods_are_deleted() -> None:
    pods = [pod("gpus-0"), pod("gpus-1", "Failed"), pod("gpus-2"), pod("gpus-x")]
    decided = plan(view(replicas=2), pods, None)
    assert decided.delete == ("gpus-1", "gpus-2", "gpus-x")
    assert decided.create == ()  # gpus-1 is made again once it is gone


def test_a_host_pod_of_an_older_spec_is_replaced_and_replicas_alone_roll_nothing() -> None:
    decided = plan(view(replicas=2), [pod("gpus-0", template="0ld"), pod("gpus-1")], None)
    assert decided.delete == ("gpus-0",) and decided.create == ()
    # One host pod alone: nothing else can serve meanwhile, it is replaced all the same.
    assert plan(view(replicas=1), [pod("gpus-0", template="0ld")], None).delete == ("gpus-0",)
    assert host_template_hash(view(replicas=5).spec) == CURRENT
    assert host_template_hash(view(deviceMemory="4Gi").spec) != CURRENT
    labels = build_host_pod(view(), 0)["metadata"]["labels"]
    assert labels["modelpool.dev/template-hash"] == CURRENT


def test_a_new_spec_rolls_the_host_pods_one_at_a_time_while_the_others_serve() -> None:
    """Like a Deployment's maxUnavailable 1: a spec change replaced every host pod in one pass before, and
    every model on every host went at once."""
    host = view(replicas=3)
    old = [pod(f"gpus-{i}", template="0ld") for i in range(3)]
    assert plan(host, old, None).delete == ("gpus-0",)  # the lowest index, alone
    # While it goes, and while its replacement is missing or not Ready, no other one goes.
    going = [pod("gpus-0", template="0ld", deleting=True), *old[1:]]
    assert plan(host, going, None).delete == ()
    assert plan(host, old[1:], None).delete == () and plan(host, old[1:], None).create == (0,)
    loading = [pod("gpus-0", "Loading", ready=False), *old[1:]]
    assert plan(host, loading, None).delete == ()
    # Once it serves on the new spec, the next one goes; an idle or busy host pod serves as well.
    assert plan(host, [pod("gpus-0", "Idle"), *old[1:]], None).delete == ("gpus-1",)
    busy = [pod("gpus-0"), pod("gpus-1", "Processing"), old[2]]
    assert plan(host, busy, None).delete == ("gpus-2",)
    assert plan(host, [pod(f"gpus-{i}") for i in range(3)], None).delete == ()


def test_a_host_pod_of_an_older_spec_that_serves_nothing_goes_at_once() -> None:
    """An old pod that never got Ready (a bad image, no node) holds no model: holding it back would only
    keep the fix of its spec from rolling out."""
    host = view(replicas=3)
    stuck = [pod(f"gpus-{i}", "Pending", ready=False, template="0ld") for i in range(3)]
    assert plan(host, stuck, None).delete == ("gpus-0", "gpus-1", "gpus-2")
    # A serving old one beside a stuck one waits: the stuck one is down already.
    mixed = [
        pod("gpus-0", template="0ld"),
        pod("gpus-1", "Pending", ready=False, template="0ld"),
        pod("gpus-2"),
    ]
    assert plan(host, mixed, None).delete == ("gpus-1",)
    # Failed ones and extras beyond replicas go whatever the roll does.
    extra = [*(pod(f"gpus-{i}", template="0ld") for i in range(2)), pod("gpus-2", "Failed"), pod("gpus-3")]
    assert plan(host, extra, None).delete == ("gpus-2", "gpus-3")


def test_the_status_lists_each_host_pod_with_its_devices_and_the_totals() -> None:
    status = plan(view(replicas=3), [pod("gpus-1"), pod("gpus-0", "Loading", ready=False)], None).status
    assert (status.replicas, status.ready_replicas, status.ready_text) == (2, 1, "1/3")
    assert [h.name for h in status.hosts] == ["gpus-0", "gpus-1"]
    assert status.hosts[0].devices[0].capacity == "8Gi"
    assert status.memory.free_bytes == 16 * GI and status.selector == f"{LABEL_HOST}=gpus"


def test_a_host_image_beyond_the_allowlist_is_a_violation() -> None:
    policy = Policy(images=("ghcr.io/modelpool/",))
    assert host_violations(view(image="ghcr.io/modelpool/server:2").spec, policy, "ns") == []
    assert host_violations(view().spec, policy, "ns") == []  # the operator's default image
    [violation] = host_violations(view(image="evil.io/miner").spec, policy, "ns")
    assert violation.field == FIELD_IMAGE and "evil.io/miner" in violation.message


def test_host_placement_and_namespace_obey_the_pools_rules() -> None:
    policy = Policy(operator_namespace="mp-system")
    gpu = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    allowed = view(nodeSelector={"nvidia.com/gpu.product": "H100"}, tolerations=gpu)
    assert host_violations(allowed.spec, policy, "ns") == []
    # A node's role, and a toleration without a key (every taint: the control plane's too).
    placed = view(
        nodeSelector={"node-role.kubernetes.io/control-plane": ""}, tolerations=[{"operator": "Exists"}]
    )
    assert host_violations(placed.spec, policy, "mp-system") == [
        Violation(FIELD_NAMESPACE, msg_operator_namespace("mp-system")),
        Violation(
            FIELD_HOST_TOLERATIONS, msg_toleration(FIELD_HOST_TOLERATIONS, "*", policy.toleration_keys)
        ),
        Violation(
            FIELD_HOST_NODE_SELECTOR,
            msg_node_selector(
                FIELD_HOST_NODE_SELECTOR, "node-role.kubernetes.io/control-plane", policy.node_selector_keys
            ),
        ),
    ]


def test_a_host_pods_hash_covers_the_operators_default_image_and_flags_but_not_replicas() -> None:
    """Issue 31 item 4, for host pods: a new default server image or port rolls them; replicas do not."""
    settings = PodSettings(default_image="img:1")
    current = host_pod_template_hash(view(), settings)
    assert host_pod_template_hash(view(replicas=5), settings) == current
    assert host_pod_template_hash(view(), replace(settings, default_image="img:2")) != current
    assert host_pod_template_hash(view(), replace(settings, port=settings.port + 1)) != current
    assert host_pod_template_hash(view(image="mine:1"), settings) == host_pod_template_hash(
        view(image="mine:1"), replace(settings, default_image="img:2")
    )
    rendered = replace(view(), template_hash=current)
    assert (
        build_host_pod(rendered, 0, settings)["metadata"]["labels"]["modelpool.dev/template-hash"] == current
    )
