"""Pure builders: the worker Pod, the Service, the template hash."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from modelpool_contract.api import ModelCacheSpec, parse_pool_spec
from modelpool_contract.exits import termination_grace_period_s, worst_case_shutdown_s
from modelpool_contract.flags import CPU_SHARE_ENV, DEFAULT_WORKER_CPU
from modelpool_contract.labels import (
    ANNOTATION_MEMORY,
    LABEL_POOL,
    LABEL_SERVING,
    LABEL_TEMPLATE_HASH,
    LABEL_WORKER,
    SERVER_CONTAINER,
)
from modelpool_contract.mounts import HOME_PATH, SCRATCH_ENV, TMP_PATH
from modelpool_contract.picker import ENGINE_TYPE, ENGINE_TYPE_LABEL, LEGACY_ENGINE_TYPE_LABEL
from modelpool_operator.effects.resources import (
    PodSettings,
    build_service,
    build_worker_pod,
    eviction_patch,
    server_args,
    worker_template_hash,
)
from modelpool_operator.pool import PoolView, host_load_settings, template_hash, worker_name
from tests.operator.unit.op_pods import at


def pool(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"source": "/models/minilm", "task": "text-embedding", "dtype": "float32"},
        "resources": {"memory": "2Gi", "gpus": 1, "cpu": "500m"},
        "replicas": 2,
        "queue": {"capacity": 7, "maxBatchSize": 4, "maxBatchDelayMs": 3, "requestTimeoutSeconds": 12.5},
        "idleTimeoutSeconds": 90,
        "podTemplate": {
            "labels": {"team": "a"},
            "annotations": {"note": "x"},
            "nodeSelector": {"gpu": "yes"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "env": [{"name": "FOO", "value": "bar"}],
            "serviceAccountName": "workers",
        },
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "emb", "namespace": "team", "uid": "u-1", "generation": 3},
        "spec": spec,
    }


def view(body: dict[str, Any], revision: str = "h") -> PoolView:
    """The parsed pool, with a given template hash."""
    return replace(PoolView.from_body(body), template_hash=revision)


def spec_hash(body: dict[str, Any]) -> str:
    return template_hash(parse_pool_spec(body["spec"]))


def test_worker_pod_shape() -> None:
    pod = build_worker_pod(view(pool(), "abcdef1234"), "emb-abcde-0", PodSettings(default_image="img:1"))
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "emb-abcde-0" and meta["namespace"] == "team"
    assert meta["labels"][LABEL_POOL] == "emb" and meta["labels"][LABEL_WORKER] == "emb-abcde-0"
    assert meta["labels"][LABEL_TEMPLATE_HASH] == "abcdef1234" and meta["labels"][LABEL_SERVING] == "true"
    assert meta["labels"]["team"] == "a" and meta["annotations"]["note"] == "x"
    assert meta["annotations"][ANNOTATION_MEMORY] == str(2 * 2**30)
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "modelpool.dev/v1alpha1",
            "kind": "ModelPool",
            "name": "emb",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"gpu": "yes"} and spec["serviceAccountName"] == "workers"
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["terminationGracePeriodSeconds"] == termination_grace_period_s(30)
    (c,) = spec["containers"]
    assert c["image"] == "img:1" and c["command"] == ["modelpool-server"]
    # A GPU pool is charged its accelerator memory (2Gi, the annotation above); the container's RAM is the
    # documented default: 2Gi requested, no limit.
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert c["resources"]["requests"] == {"memory": str(2 * 2**30), "nvidia.com/gpu": "1", "cpu": "500m"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] == 1800
    # A loaded worker becomes routable within a couple of seconds (the wait of a request that woke a pool).
    assert c["startupProbe"]["periodSeconds"] <= 2 and c["readinessProbe"]["periodSeconds"] <= 2
    assert c["terminationMessagePath"] == "/dev/termination-log"
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["ports"] == [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
        {"name": "probes", "containerPort": 8001, "protocol": "TCP"},
    ]
    # Probes go to the supervisor's probe port, apart from the traffic; so does the /stats scrape.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == "probes"
    args = c["args"]
    assert args[args.index("--port") + 1] == "8000" and args[args.index("--probe-port") + 1] == "8001"
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "FOO", "value": "bar"} in c["env"]


def test_user_code_finds_no_token_and_writes_only_to_its_volumes() -> None:
    pod = build_worker_pod(view(pool()), "w")
    spec = pod["spec"]
    (c,) = spec["containers"]
    # No service account token unless the pool asks for one.
    assert spec["automountServiceAccountToken"] is False
    template = {**pool()["spec"]["podTemplate"], "automountServiceAccountToken": True}
    asked = build_worker_pod(view(pool(podTemplate=template)), "w")
    assert asked["spec"]["automountServiceAccountToken"] is True
    # A read-only root; every place a library writes to is an emptyDir.
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts[TMP_PATH] == "tmp" and mounts[HOME_PATH] == "home"
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}} and volumes["home"] == {
        "name": "home",
        "emptyDir": {},
    }
    env = {e["name"]: e.get("value") for e in c["env"]}
    for name, path in SCRATCH_ENV:
        assert env[name] == path
        assert any(path == m or path.startswith(m + "/") for m in mounts), (name, path)
    assert env["TMPDIR"] == "/tmp" and env["HOME"] == "/home/modelpool"
    # A pool's own value wins.
    template = {**pool()["spec"]["podTemplate"], "env": [{"name": "HOME", "value": "/cache/home"}]}
    (own,) = build_worker_pod(view(pool(podTemplate=template)), "w")["spec"]["containers"]
    assert [e["value"] for e in own["env"] if e["name"] == "HOME"] == ["/cache/home"]


def test_server_args_follow_the_spec() -> None:
    args = server_args("emb", parse_pool_spec(pool()["spec"]), PodSettings())
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert pairs["--model"] == "/models/minilm" and pairs["--task"] == "text-embedding"
    assert pairs["--name"] == "emb" and pairs["--port"] == "8000"
    assert pairs["--queue-capacity"] == "7" and pairs["--max-batch-size"] == "4"
    assert pairs["--max-batch-delay-ms"] == "3" and pairs["--request-timeout"] == "12.5"
    assert pairs["--idle-after"] == "90" and pairs["--dtype"] == "float32" and pairs["--device"] == "auto"
    assert "--trust-remote-code" not in args


def test_the_workers_log_format_is_the_operators_and_the_default_adds_no_flag() -> None:
    spec = parse_pool_spec(pool()["spec"])
    assert "--log-format" not in server_args("emb", spec, PodSettings(log_format="json"))
    args = server_args("emb", spec, PodSettings(log_format="plain"))
    assert args[args.index("--log-format") + 1] == "plain"


@pytest.mark.parametrize(("runtime", "flag"), [(None, None), ("torch", None), ("onnxruntime", "onnxruntime")])
def test_the_encoder_runtime_is_passed_and_the_default_adds_no_flag(
    runtime: str | None, flag: str | None
) -> None:
    model = {
        "source": "/models/minilm",
        "task": "text-embedding",
        **({"runtime": runtime} if runtime else {}),
    }
    spec = parse_pool_spec(pool(model=model)["spec"])
    args = server_args("emb", spec, PodSettings())
    assert (args[args.index("--runtime") + 1] if "--runtime" in args else None) == flag
    assert host_load_settings(spec).get("runtime") == flag


def test_cpu_only_pool_has_no_gpu_and_hf_revision() -> None:
    body = pool(
        resources={"memory": "1Gi"},
        model={
            "source": "hf://org/m@main",
            "task": "text-generation",
            "revision": "v2",
            "trustRemoteCode": True,
        },
    )
    pod = build_worker_pod(view(body), "emb-x-0")
    (c,) = pod["spec"]["containers"]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    # On a CPU pool the weights live in RAM: what the worker is charged is its RAM, requested and limited.
    assert c["resources"]["limits"]["memory"] == c["resources"]["requests"]["memory"] == str(2**30)
    assert c["args"][c["args"].index("--model") + 1] == "hf://org/m@v2"
    assert "--trust-remote-code" in c["args"]


@pytest.mark.parametrize(
    ("resources", "ram_request", "limit"),
    [
        ({"memory": "40Gi", "gpus": 2}, 2 * 2**30, None),
        ({"memory": "40Gi", "gpus": 2, "hostMemory": "24Gi"}, 24 * 2**30, 24 * 2**30),
        ({"memory": "3Gi"}, 3 * 2**30, 3 * 2**30),
        ({"memory": "3Gi", "hostMemory": "5Gi"}, 5 * 2**30, 5 * 2**30),
    ],
)
def test_container_ram_is_host_memory_or_its_default_and_the_charge_is_memory(
    resources: dict[str, Any], ram_request: int, limit: int | None
) -> None:
    pod = build_worker_pod(view(pool(resources=resources)), "w")
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["requests"]["memory"] == str(ram_request)
    assert c["resources"]["limits"].get("memory") == (None if limit is None else str(limit))
    assert pod["metadata"]["annotations"][ANNOTATION_MEMORY] == str(
        parse_pool_spec(pool(resources=resources)["spec"]).resources.memory_bytes
    )


def test_env_from_a_secret_key_is_a_reference_never_the_value() -> None:
    env = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": True}}},
        {"name": "EMPTY"},
    ]
    pod = build_worker_pod(view(pool(podTemplate={"env": env})), "w")
    (c,) = pod["spec"]["containers"]
    assert c["env"][:3] == [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": True}}},
        {"name": "EMPTY", "value": ""},
    ]


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "A", "valueFrom": {}},
        {
            "name": "A",
            "valueFrom": {
                "secretKeyRef": {"name": "s", "key": "k"},
                "configMapKeyRef": {"name": "c", "key": "k"},
            },
        },
    ],
)
def test_an_env_entry_has_one_source(entry: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="value"):
        parse_pool_spec(pool(podTemplate={"env": [entry]})["spec"])


def test_api_key_secret_is_mounted_and_passed_as_a_file() -> None:
    body = pool(auth={"apiKeySecret": {"name": "keys", "key": "emb"}})
    pod = build_worker_pod(view(body), "w")
    (c,) = pod["spec"]["containers"]
    assert c["args"][-2:] == ["--api-key-file", "/etc/modelpool/api-key/api-key"]
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "api-key"]
    assert volume["secret"] == {
        "secretName": "keys",
        "items": [{"key": "emb", "path": "api-key"}],
        "defaultMode": 0o440,
    }
    assert {"name": "api-key", "mountPath": "/etc/modelpool/api-key", "readOnly": True} in c["volumeMounts"]
    assert not any(e.get("name") == "MODELPOOL_API_KEY" for e in c["env"]), "the key is never in the spec"
    # Without auth: no flag, no volume; adding it rolls the workers (it shapes the pod).
    plain = build_worker_pod(view(pool()), "w")
    assert "--api-key-file" not in plain["spec"]["containers"][0]["args"]
    assert spec_hash(body) != spec_hash(pool())


def test_pvc_source_mounts_the_claim_where_the_server_is_told_to_look() -> None:
    pod = build_worker_pod(view(pool(model={"source": "pvc://models/minilm", "task": "text-embedding"})), "w")
    claims = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}]
    (c,) = pod["spec"]["containers"]
    assert {"name": "model", "mountPath": "/models/models", "readOnly": True} in c["volumeMounts"]
    assert c["args"][c["args"].index("--pvc-root") + 1] == "/models"
    assert "--pvc-root" not in build_worker_pod(view(pool()), "w")["spec"]["containers"][0]["args"]


def test_adapters_are_passed_and_their_claims_mounted_once() -> None:
    adapters = [
        {"name": "sql", "source": "hf://org/sql-lora"},
        {"name": "poem", "source": "pvc://loras/poem"},
        {"name": "tale", "source": "pvc://loras/tale@x"},
        {"name": "own", "source": "pvc://models/own-lora"},  # the model's claim, mounted already
    ]
    model = {"source": "pvc://models/llm", "task": "text-generation"}
    pod = build_worker_pod(view(pool(model=model, adapters=adapters, maxLoadedAdapters=2)), "w")
    (c,) = pod["spec"]["containers"]
    args = c["args"]
    flags = [args[i + 1] for i, a in enumerate(args) if a == "--adapter"]
    assert flags == [
        "sql=hf://org/sql-lora",
        "poem=pvc://loras/poem",
        "tale=pvc://loras/tale@x",
        "own=pvc://models/own-lora",
    ]
    assert args[args.index("--max-adapters") + 1] == "2"
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["models", "loras"]
    assert {"name": "adapter-claim-0", "mountPath": "/models/loras", "readOnly": True} in c["volumeMounts"]
    plain = build_worker_pod(view(pool()), "w")["spec"]["containers"][0]["args"]
    assert "--adapter" not in plain and "--max-adapters" not in plain


def test_a_local_model_with_pvc_adapters_gets_the_pvc_root() -> None:
    adapters = [{"name": "poem", "source": "pvc://loras/poem"}]
    pod = build_worker_pod(
        view(pool(model={"source": "/m", "task": "text-generation"}, adapters=adapters)), "w"
    )
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--pvc-root") + 1] == "/models"


def _cache(pod: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod["spec"]["containers"]
    assert {"name": "cache", "mountPath": "/cache"} in c["volumeMounts"]
    assert {"name": "HF_HOME", "value": "/cache/huggingface"} in c["env"]
    volume: dict[str, Any] = next(v for v in pod["spec"]["volumes"] if v["name"] == "cache")
    return volume


HF = {"source": "hf://org/m", "task": "text-embedding"}


@pytest.mark.parametrize(
    ("model", "default", "volume"),
    [
        (HF, None, {"emptyDir": {}}),
        (
            {**HF, "cache": {"type": "pvc", "claimName": "hub"}},
            None,
            {"persistentVolumeClaim": {"claimName": "hub"}},
        ),
        (
            {**HF, "cache": {"type": "hostPath", "path": "/var/cache/models"}},
            None,
            {"hostPath": {"path": "/var/cache/models", "type": "DirectoryOrCreate"}},
        ),
        # The operator's default applies to pools that set none; a pool's own choice wins.
        (
            HF,
            ModelCacheSpec(type="pvc", claim_name="shared"),
            {"persistentVolumeClaim": {"claimName": "shared"}},
        ),
        # The operator's hostPath default: one directory per namespace, never one for all (uid 10001 is
        # every namespace's).
        (
            HF,
            ModelCacheSpec(type="hostPath", path="/var/cache/models/"),
            {"hostPath": {"path": "/var/cache/models/team", "type": "DirectoryOrCreate"}},
        ),
        (
            {**HF, "cache": {"type": "none"}},
            ModelCacheSpec(type="pvc", claim_name="shared"),
            {"emptyDir": {}},
        ),
        # Only hf:// sources download: others keep a private emptyDir for HF_HOME.
        (
            {"source": "/models/m", "task": "text-embedding", "cache": {"type": "pvc", "claimName": "hub"}},
            None,
            {"emptyDir": {}},
        ),
    ],
)
def test_model_cache_volume(
    model: dict[str, Any], default: ModelCacheSpec | None, volume: dict[str, Any]
) -> None:
    pod = build_worker_pod(view(pool(model=model)), "w", PodSettings(model_cache=default))
    assert _cache(pod) == {"name": "cache", **volume}


def test_the_template_hash_is_stable() -> None:
    # A change here changes every pool's hash, which rolls every worker when the operator is upgraded
    # (unset optional fields are left out of it, so a field the API gains later changes nothing).
    assert spec_hash(pool()) == "5e3a589c33"


def test_a_changed_cache_rolls_the_workers() -> None:
    assert spec_hash(pool(model=HF)) != spec_hash(
        pool(model={**HF, "cache": {"type": "pvc", "claimName": "x"}})
    )


def test_service_selects_serving_workers_only() -> None:
    svc = build_service(view(pool()))
    assert svc["spec"]["selector"] == {LABEL_POOL: "emb", LABEL_SERVING: "true"}
    assert svc["metadata"]["name"] == "emb" and svc["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


def test_service_is_headless() -> None:
    """No virtual IP: the gateway routes to pod addresses, and a ClusterIP per pool exhausts the Service IP
    range (at 300 pools, 47 got no Service)."""
    spec = build_service(view(pool()))["spec"]
    assert (spec["type"], spec["clusterIP"]) == ("ClusterIP", "None")


def test_template_hash_ignores_scaling_fields() -> None:
    base = spec_hash(pool())
    assert base == spec_hash(pool(replicas=1, maxReplicas=5, minReplicas=0, priority=9))
    assert base != spec_hash(pool(image="other:2"))
    assert base != spec_hash(pool(queue={"capacity": 8}))
    assert len(base) == 10


def test_a_text_generation_worker_carries_the_pickers_engine_type() -> None:
    """The endpoint picker reads the vLLM names from pods labelled with that engine (issue 33); a worker of
    another task carries no such label, and a pool's own label of that key wins (its engineConfigs)."""
    model = {"source": "/models/llm", "task": "text-generation"}
    labels = build_worker_pod(view(pool(model=model)), "emb-abcde-0")["metadata"]["labels"]
    assert labels[ENGINE_TYPE_LABEL] == ENGINE_TYPE and labels[LEGACY_ENGINE_TYPE_LABEL] == ENGINE_TYPE
    assert ENGINE_TYPE_LABEL not in build_worker_pod(view(pool()), "emb-abcde-0")["metadata"]["labels"]
    own = {"labels": {ENGINE_TYPE_LABEL: "ours"}}
    labelled = build_worker_pod(view(pool(model=model, podTemplate=own)), "emb-abcde-0")
    assert labelled["metadata"]["labels"][ENGINE_TYPE_LABEL] == "ours"


@pytest.mark.parametrize("name", ["p", "a" * 80, "pool-with-dashes-"])
def test_worker_names_fit_a_label_value(name: str) -> None:
    out = worker_name(name, "abcdef", 123)
    assert len(out) <= 63 and out.endswith("-abcde-123") and "--" not in out


def test_long_pool_names_that_begin_alike_name_their_workers_apart() -> None:
    """Cut to fit, two names sharing their first 45 characters once gave both pools the same workers."""
    first, second = "a" * 45 + "-first", "a" * 45 + "-second"
    assert worker_name(first, "abcdef", 0) != worker_name(second, "abcdef", 0)
    assert worker_name("short", "abcdef", 0) == "short-abcde-0"  # names that fit are as they were
    assert worker_name("b" * 45, "abcdef", 0) == "b" * 45 + "-abcde-0"


def test_eviction_patch_stops_routing_and_records_the_observed_state() -> None:
    """The state the operator observed when it decided travels in the same patch as the mark, so an audit
    never sees an eviction without it (bench/soak/auditor.py judges it)."""
    patch = eviction_patch("IdleTimeout", at(5), "Idle")
    assert patch["metadata"]["labels"] == {LABEL_SERVING: None}
    assert patch["metadata"]["annotations"] == {
        "modelpool.dev/evicting": "IdleTimeout",
        "modelpool.dev/evicting-since": "2026-01-01T12:00:05Z",
        "modelpool.dev/evicted-in-state": "Idle",
    }


@pytest.mark.parametrize("drain_timeout", [0, 1, 30, 299])
def test_the_grace_period_covers_the_servers_worst_case_shutdown(drain_timeout: int) -> None:
    """The kubelet's SIGKILL comes after terminationGracePeriodSeconds: it must never cut the server's
    own shutdown short (the drain, then stopping its processes), whose worst case the contract computes
    from the same constants the supervisor uses."""
    from modelpool_contract.exits import DRAIN_GRACE_S, INFERENCE_FLUSH_S, KILL_TIMEOUT_S, STOP_TIMEOUT_S

    settings = PodSettings(default_image="img:1", drain_timeout_s=drain_timeout)
    spec = build_worker_pod(view(pool()), "emb-abc12-0", settings)["spec"]
    grace = spec["terminationGracePeriodSeconds"]
    assert isinstance(grace, int)
    assert grace >= worst_case_shutdown_s(drain_timeout)
    assert (
        worst_case_shutdown_s(drain_timeout)
        >= drain_timeout + DRAIN_GRACE_S + STOP_TIMEOUT_S + KILL_TIMEOUT_S
    )
    # The inference process's own exit after a drain (its answers flushed) fits in the drain's grace.
    assert INFERENCE_FLUSH_S < DRAIN_GRACE_S


def test_the_worker_gets_its_cpu_share_and_a_pools_threads() -> None:
    (c,) = build_worker_pod(view(pool()), "w")["spec"]["containers"]  # resources.cpu: 500m
    share = [e for e in c["env"] if e["name"] == CPU_SHARE_ENV]
    ref = {"containerName": SERVER_CONTAINER, "resource": "requests.cpu", "divisor": "1m"}
    assert share == [{"name": CPU_SHARE_ENV, "valueFrom": {"resourceFieldRef": ref}}]
    assert "--intra-op-threads" not in c["args"]
    resources = {"memory": "2Gi", "cpuThreads": 3}  # no CPU request (default off): no share to pass
    off = PodSettings(default_cpu=None)
    (c,) = build_worker_pod(view(pool(resources=resources)), "w", off)["spec"]["containers"]
    assert not any(e["name"] == CPU_SHARE_ENV for e in c["env"])
    assert c["args"][c["args"].index("--intra-op-threads") + 1] == "3"


def _cpu_of(pod: dict[str, Any]) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    """The server container's CPU request and limit, and its CPU share variables."""
    (c,) = pod["spec"]["containers"]
    share = [e for e in c["env"] if e["name"] == CPU_SHARE_ENV]
    return c["resources"]["requests"].get("cpu"), c["resources"]["limits"].get("cpu"), share


SHARE_FROM_REQUEST = {
    "name": CPU_SHARE_ENV,
    "valueFrom": {
        "resourceFieldRef": {"containerName": SERVER_CONTAINER, "resource": "requests.cpu", "divisor": "1m"}
    },
}


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_worker_without_resources_cpu_gets_the_default_request_and_its_share(gpus: int) -> None:
    no_cpu = pool(resources={"memory": "2Gi", "gpus": gpus})
    # The built-in default (the contract's, which the operator's setting and the chart's value default to).
    assert _cpu_of(build_worker_pod(view(no_cpu), "w")) == (DEFAULT_WORKER_CPU, None, [SHARE_FROM_REQUEST])
    # A configured default: a request only, never a limit; the server sizes its threads from the share.
    pod = build_worker_pod(view(no_cpu), "w", PodSettings(default_cpu="1500m"))
    assert _cpu_of(pod) == ("1500m", None, [SHARE_FROM_REQUEST])


def test_an_explicit_resources_cpu_wins_over_the_default() -> None:
    pod = build_worker_pod(view(pool()), "w", PodSettings(default_cpu="4"))  # resources.cpu: 500m
    assert _cpu_of(pod) == ("500m", None, [SHARE_FROM_REQUEST])
    pod = build_worker_pod(view(pool()), "w", PodSettings(default_cpu=None))
    assert _cpu_of(pod) == ("500m", None, [SHARE_FROM_REQUEST])


def test_the_default_turned_off_leaves_a_pool_without_resources_cpu_unrequested() -> None:
    no_cpu = pool(resources={"memory": "2Gi"})
    assert _cpu_of(build_worker_pod(view(no_cpu), "w", PodSettings(default_cpu=None))) == (None, None, [])


def test_a_pools_own_cpu_share_variable_is_kept() -> None:
    env = [{"name": CPU_SHARE_ENV, "value": "3000"}]
    no_cpu = pool(resources={"memory": "2Gi"}, podTemplate={"env": env})
    assert _cpu_of(build_worker_pod(view(no_cpu), "w")) == (DEFAULT_WORKER_CPU, None, env)


def test_the_template_hash_covers_what_the_operator_adds_and_nothing_that_does_not_shape_a_pod() -> None:
    """Issue 31 item 4: a new default server image, flag (the drain timeout, the ports) or default CPU of the
    operator changes the hash, so its workers roll; scaling fields and a rebuilt operator with the same
    settings do not (a restart rolls nothing)."""
    settings = PodSettings(default_image="img:1")
    current = worker_template_hash(PoolView.from_body(pool()), settings)
    assert current == worker_template_hash(PoolView.from_body(pool()), PodSettings(default_image="img:1"))
    rescaled = pool(replicas=5, minReplicas=1, maxReplicas=9, priority=3)
    assert worker_template_hash(PoolView.from_body(rescaled), settings) == current
    changed = (
        replace(settings, default_image="img:2"),
        replace(settings, drain_timeout_s=settings.drain_timeout_s + 1),
        replace(settings, probe_port=settings.probe_port + 1),
        replace(settings, default_cpu="3"),
    )
    hashes = {worker_template_hash(PoolView.from_body(pool(resources={"memory": "2Gi"})), s) for s in changed}
    assert len(hashes) == len(changed)
    assert worker_template_hash(PoolView.from_body(pool(queue={"capacity": 8})), settings) != current
    # A pool that names its own image is not rolled by a new default image.
    own = PoolView.from_body(pool(image="mine:1"))
    assert worker_template_hash(own, settings) == worker_template_hash(
        own, replace(settings, default_image="x")
    )
