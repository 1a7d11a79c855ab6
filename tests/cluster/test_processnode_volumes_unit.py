"""The process node's rules without a cluster: which host directory backs each volume, the hostPath type
checks, each container's mount table, the path-rewrite rule and the mount root on a real temporary
filesystem; its taint; the retry back-off; and the guard that tells its own cluster from another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testkit.processnode.kubeapi import ClusterGuard
from testkit.processnode.node import node_object, parse_taint, with_taints
from testkit.processnode.pod import Retry
from testkit.processnode.podspec import SpecError
from testkit.processnode.volumes import (
    ROOT_ENV,
    ContainerView,
    HostSource,
    VolumeError,
    materialize,
    mount_table,
    pod_volume_dirs,
    prepare,
    remove_pod_dir,
    volume_source,
)

JSON = dict[str, Any]


def api(objects: dict[str, JSON]) -> Any:
    """A getter over fixed API objects (what Kube.get answers: the object, or None for 404)."""
    return objects.get


PVC_PATH = "/api/v1/namespaces/ns/persistentvolumeclaims/models"
PV_PATH = "/api/v1/persistentvolumes/pv-models"


def claim(phase: str = "Bound", volume_name: str = "pv-models") -> JSON:
    return {"spec": {"volumeName": volume_name}, "status": {"phase": phase}}


def test_volume_sources_emptydir_hostpath_and_unmounted_types(tmp_path: Path) -> None:
    get = api({})
    empty = volume_source({"name": "cache", "emptyDir": {}}, "ns", tmp_path, get)
    assert empty == HostSource(tmp_path / "volumes" / "cache", "EmptyDir")
    host = volume_source(
        {"name": "h", "hostPath": {"path": "/srv/x", "type": "Directory"}}, "ns", tmp_path, get
    )
    assert host == HostSource(Path("/srv/x"), "Directory")
    assert volume_source({"name": "c", "configMap": {"name": "cm"}}, "ns", tmp_path, get) is None


def test_a_secret_volume_is_its_keys_as_files(tmp_path: Path) -> None:
    secret = {"data": {"key": "czNjcmV0", "other": "eA=="}}  # base64 of "s3cret", "x"
    get = api({"/api/v1/namespaces/ns/secrets/ctl": secret})
    items = {"secretName": "ctl", "items": [{"key": "key", "path": "k/key"}], "defaultMode": 0o440}
    source = volume_source({"name": "c", "secret": items}, "ns", tmp_path, get)
    assert source == HostSource(tmp_path / "volumes" / "c", "Directory")
    assert (source.path / "k" / "key").read_text() == "s3cret"
    assert not (source.path / "other").exists()
    every = volume_source({"name": "all", "secret": {"secretName": "ctl"}}, "ns", tmp_path, get)
    assert every is not None and sorted(p.name for p in every.path.iterdir()) == ["key", "other"]
    for bad, reason in (
        ({"secretName": "gone"}, "not found"),
        ({"secretName": "ctl", "items": [{"key": "nope", "path": "x"}]}, "no key"),
        ({"secretName": "ctl", "items": [{"key": "key", "path": "../x"}]}, "relative"),
    ):
        with pytest.raises(VolumeError, match=reason):
            volume_source({"name": "b", "secret": bad}, "ns", tmp_path, get)


def test_pvc_resolves_to_its_bound_persistent_volume(tmp_path: Path) -> None:
    volume = {"name": "model", "persistentVolumeClaim": {"claimName": "models"}}
    host_pv = {"spec": {"hostPath": {"path": "/data/models", "type": "DirectoryOrCreate"}}}
    got = volume_source(volume, "ns", tmp_path, api({PVC_PATH: claim(), PV_PATH: host_pv}))
    assert got == HostSource(Path("/data/models"), "DirectoryOrCreate")
    local_pv = {"spec": {"local": {"path": "/mnt/disks/ssd1"}}}
    got = volume_source(volume, "ns", tmp_path, api({PVC_PATH: claim(), PV_PATH: local_pv}))
    assert got == HostSource(Path("/mnt/disks/ssd1"), "Exists")


@pytest.mark.parametrize(
    ("objects", "message"),
    [
        ({}, 'persistentvolumeclaim "models" not found'),
        (
            {PVC_PATH: claim(phase="Pending", volume_name="")},
            "error processing PVC ns/models: PVC is not bound",
        ),
        ({PVC_PATH: claim()}, 'persistentvolume "pv-models" (bound to ns/models) not found'),
        (
            {PVC_PATH: claim(), PV_PATH: {"spec": {"nfs": {"server": "x", "path": "/"}}}},
            "persistentvolume 'pv-models' is neither hostPath nor local",
        ),
    ],
)
def test_pvc_that_cannot_be_mounted_names_the_reason(
    tmp_path: Path, objects: dict[str, JSON], message: str
) -> None:
    volume = {"name": "model", "persistentVolumeClaim": {"claimName": "models"}}
    with pytest.raises(VolumeError) as err:
        volume_source(volume, "ns", tmp_path, api(objects))
    assert err.value.volume == "model" and message in err.value.message
    assert str(err.value).startswith("MountVolume.SetUp failed for volume 'model': ")


def test_hostpath_type_checks_and_creation(tmp_path: Path) -> None:
    made = prepare("v", HostSource(tmp_path / "a" / "b", "DirectoryOrCreate"))
    assert made.is_dir()
    touched = prepare("v", HostSource(tmp_path / "f.txt", "FileOrCreate"))
    assert touched.is_file() and touched.read_bytes() == b""
    assert prepare("v", HostSource(tmp_path / "a", "Directory")) == tmp_path / "a"
    assert prepare("v", HostSource(tmp_path / "missing", "")) == tmp_path / "missing"  # no check
    for source, message in [
        (HostSource(tmp_path / "missing", "Directory"), "is not a directory"),
        (HostSource(tmp_path / "a", "File"), "is not a file"),
        (HostSource(tmp_path / "f.txt", "Socket"), "is not a socket"),
        (HostSource(tmp_path / "nope", "Exists"), "does not exist"),
        (HostSource(tmp_path / "no-parent" / "f", "FileOrCreate"), "cannot create"),
    ]:
        with pytest.raises(VolumeError, match=message):
            prepare("v", source)


def test_mount_table_subpaths_skips_unmounted_and_refuses_nesting() -> None:
    dirs = {"data": Path("/h/data"), "cache": Path("/h/cache")}
    container = {
        "volumeMounts": [
            {"name": "data", "mountPath": "/models/m/"},
            {"name": "cache", "mountPath": "/cache", "subPath": "hf"},
            {"name": "data", "mountPath": "/per-pod", "subPathExpr": "logs/$(POD_NAME)"},
            {"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ]
    }
    assert mount_table(container, dirs, {"POD_NAME": "p-1"}) == {
        "/models/m": Path("/h/data"),
        "/cache": Path("/h/cache/hf"),
        "/per-pod": Path("/h/data/logs/p-1"),
    }
    nested = {"volumeMounts": [{"name": "data", "mountPath": "/a"}, {"name": "cache", "mountPath": "/a/b"}]}
    with pytest.raises(SpecError, match="nested volume mounts"):
        mount_table(nested, dirs, {})
    escape = {"volumeMounts": [{"name": "data", "mountPath": "/a", "subPath": "../etc"}]}
    with pytest.raises(SpecError, match="relative path within its volume"):
        mount_table(escape, dirs, {})


VIEW = ContainerView(Path("/pods/u1/root/server"), {"/models/minilm": Path("/h/pv"), "/cache": Path("/h/c")})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/models/minilm", "/pods/u1/root/server/models/minilm"),  # a mountPath
        ("/models/minilm/v1/config.json", "/pods/u1/root/server/models/minilm/v1/config.json"),  # under one
        ("/models", "/pods/u1/root/server/models"),  # a parent of one
        ("/models/", "/pods/u1/root/server/models/"),
        ("/cache/huggingface", "/pods/u1/root/server/cache/huggingface"),
        ("file:///models/minilm/v1", "file:///pods/u1/root/server/models/minilm/v1"),
        ("--model=/models/minilm", "--model=/pods/u1/root/server/models/minilm"),
        ("--model=file:///cache/x", "--model=file:///pods/u1/root/server/cache/x"),
        ("/", "/"),
        ("/modelsx", "/modelsx"),  # a sibling that merely shares the prefix
        ("/models/minilm/../../etc/passwd", "/models/minilm/../../etc/passwd"),
        ("/usr/bin/python3", "/usr/bin/python3"),
        ("models/minilm", "models/minilm"),  # relative: the working directory decides
        ("pvc://minilm/v1", "pvc://minilm/v1"),
        ("a=b=/cache", "a=b=/cache"),  # only the text after the first '=' is a candidate
        ("--port=8000", "--port=8000"),
    ],
)
def test_rewrite_rule(value: str, expected: str) -> None:
    assert VIEW.rewrite(value) == expected


def test_a_host_file_under_a_mount_stays_where_it_is_unless_the_volume_has_it(tmp_path: Path) -> None:
    # Workers mount an emptyDir at /tmp; a checkout under /tmp hands them host files below it (a model).
    host_tmp, volume = tmp_path / "tmp", tmp_path / "volume"
    (host_tmp / "checkout" / "model").mkdir(parents=True)
    (volume / "shared").mkdir(parents=True)
    (host_tmp / "shared").mkdir()
    view = ContainerView(tmp_path / "root", {str(host_tmp): volume})
    model = str(host_tmp / "checkout" / "model")
    assert view.rewrite(model) == model  # on the host only: the process reads it where it is
    assert view.rewrite(f"--model={model}") == f"--model={model}"
    in_volume = str(host_tmp / "shared")  # in both: the volume's copy is the pod's
    assert view.rewrite(in_volume) == f"{tmp_path}/root{in_volume}"
    missing = str(host_tmp / "new.sock")  # on neither: the program makes it, in its volume
    assert view.rewrite(missing) == f"{tmp_path}/root{missing}"
    assert view.rewrite(str(host_tmp)) == f"{tmp_path}/root{host_tmp}"  # the mountPath itself


def test_rewrite_env_maps_the_pods_values_and_names_the_root() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/cache"}  # the agent's own values are host paths already
    env = {**base, "HF_HOME": "/cache/huggingface", "MODE": "fast"}
    assert VIEW.rewrite_env(env, base) == {
        "PATH": "/usr/bin",
        "HOME": "/cache",
        "HF_HOME": "/pods/u1/root/server/cache/huggingface",
        "MODE": "fast",
        ROOT_ENV: "/pods/u1/root/server",
    }


def test_pod_volumes_materialize_and_removal_keeps_host_directories(tmp_path: Path) -> None:
    host = tmp_path / "host" / "models"
    (host / "v1").mkdir(parents=True)
    (host / "v1" / "config.json").write_text("{}")
    pod_dir = tmp_path / "pods" / "uid-1"
    pod = {
        "metadata": {"namespace": "ns"},
        "spec": {
            "volumes": [
                {"name": "model", "persistentVolumeClaim": {"claimName": "models"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "token", "projected": {"sources": []}},
            ]
        },
    }
    pv = {"spec": {"hostPath": {"path": str(host)}}}
    dirs = pod_volume_dirs(pod, pod_dir, api({PVC_PATH: claim(), PV_PATH: pv}))
    assert dirs == {"model": host, "scratch": pod_dir / "volumes" / "scratch"}
    container = {
        "volumeMounts": [
            {"name": "model", "mountPath": "/models/models", "readOnly": True},
            {"name": "scratch", "mountPath": "/tmp"},
        ]
    }
    view = ContainerView(pod_dir / "root" / "c", mount_table(container, dirs, {}))
    materialize(view)
    materialize(view)  # a restarted container gets the same links
    assert Path(view.rewrite("/models/models/v1/config.json")).read_text() == "{}"
    assert sorted(p.name for p in Path(view.rewrite("/models")).iterdir()) == ["models"]
    Path(view.rewrite("/tmp/out.txt")).write_text("scratch")
    assert (pod_dir / "volumes" / "scratch" / "out.txt").read_text() == "scratch"

    remove_pod_dir(pod_dir)
    assert not pod_dir.exists()
    assert (host / "v1" / "config.json").read_text() == "{}"  # the PV's directory is untouched


def test_taints_parse_register_and_merge() -> None:
    taint = parse_taint("modelpool.dev/process-node=true:NoSchedule")
    assert taint == {"key": "modelpool.dev/process-node", "value": "true", "effect": "NoSchedule"}
    assert parse_taint("dedicated:NoExecute") == {"key": "dedicated", "effect": "NoExecute"}
    for bad in ("no-effect", "k=v:Sometimes", ":NoSchedule"):
        with pytest.raises(ValueError, match="KEY"):
            parse_taint(bad)
    assert node_object("n", {}, [taint])["spec"] == {"taints": [taint]}
    assert node_object("n", {}, [])["spec"] == {}
    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}
    assert with_taints([unreachable], [taint]) == [unreachable, taint]
    assert with_taints([taint, unreachable], [taint]) == [taint, unreachable]


def test_retry_backs_off_to_its_cap_and_resets() -> None:
    retry = Retry(0.5, 4.0)
    delays = []
    for _ in range(6):
        retry.failed(100.0)
        delays.append(retry.next_at - 100.0)
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert not retry.due(103.0) and retry.due(104.0)
    assert retry.succeeded() == 6 and retry.due(0.0) and retry.failures == 0


class _Answers:
    """Stands in for Kube.request: kube-system's uid as successive API servers answer (a stale API
    server attached to the next cluster's etcd is not something a test can stage reliably)."""

    def __init__(self, *uids: str) -> None:
        self.uids = list(uids)

    def request(self, method: str, path: str) -> JSON:
        assert (method, path) == ("GET", "/api/v1/namespaces/kube-system")
        return {"metadata": {"uid": self.uids.pop(0)}}


def test_cluster_guard_tells_the_joined_cluster_from_another() -> None:
    guard = ClusterGuard(_Answers("uid-a", "uid-a", "uid-b"))  # type: ignore[arg-type]
    guard.join()
    assert guard.same_cluster()  # the same control plane, restarted
    assert not guard.same_cluster()  # another cluster behind the same address
