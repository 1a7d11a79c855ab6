"""The process node's image mode without a cluster: image references -> store entries, the image's OCI
config, Kubernetes' entrypoint/cmd rules, the container's user, the runc config.json, the bind mounts,
the projected and downward API volume files, and the mount table of nested binds."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest

from testkit.imagenode import project_images, require_images
from testkit.processnode.agent import parse_args
from testkit.processnode.container import hosts_file, image_binds
from testkit.processnode.images import (
    DEFAULT_PATH,
    ImageConfig,
    User,
    candidate_names,
    container_argv,
    find_image,
    image_config,
    image_env,
    parse_passwd,
    resolve_user,
)
from testkit.processnode.oci import (
    Bind,
    Runc,
    bind_mounts,
    container_id,
    hostname_of,
    mounts_under,
    oci_config,
    state_root,
)
from testkit.processnode.podspec import SpecError
from testkit.processnode.volumes import (
    VolumeError,
    downward_value,
    fs_group,
    mount_table,
    pod_volume_dirs,
    projected_files,
    token_request,
    volume_source,
)

JSON = dict[str, Any]


def api(objects: dict[str, JSON]) -> Any:
    """A getter over fixed API objects (what Kube.get answers: the object, or None for 404)."""
    return objects.get


STORE = [
    {
        "id": "aaa111" * 10 + "aaaa",
        "names": ["ghcr.io/modelpool/modelpool-operator:0.2.0"],
        "layer": "L1",
        "digest": "sha256:d1",
    },
    {"id": "bbb222" * 10 + "bbbb", "names": ["localhost/modelpool-base:bookworm"], "layer": "L2"},
    {"id": "ccc333" * 10 + "cccc", "names": ["docker.io/library/python:3.11-slim"], "layer": "L3"},
]


# -- references -------------------------------------------------------------------------------------------
def test_candidate_names_follow_the_engines_normalization() -> None:
    assert candidate_names("ghcr.io/modelpool/modelpool-operator:0.2.0") == [
        "ghcr.io/modelpool/modelpool-operator:0.2.0"
    ]
    assert candidate_names("modelpool-base") == [
        "modelpool-base:latest",
        "localhost/modelpool-base:latest",
        "docker.io/modelpool-base:latest",
        "docker.io/library/modelpool-base:latest",
    ]
    assert candidate_names("localhost:5000/x/y") == ["localhost:5000/x/y:latest"]
    assert candidate_names("team/app:1") == ["team/app:1", "localhost/team/app:1", "docker.io/team/app:1"]
    assert candidate_names("  ") == []


def test_find_image_by_name_short_name_digest_and_id() -> None:
    assert find_image(STORE, "ghcr.io/modelpool/modelpool-operator:0.2.0") == (STORE[0]["id"], "L1")
    assert find_image(STORE, "modelpool-base:bookworm") == (STORE[1]["id"], "L2")
    assert find_image(STORE, "python:3.11-slim") == (STORE[2]["id"], "L3")
    assert find_image(STORE, "ghcr.io/modelpool/modelpool-operator@sha256:d1") == (STORE[0]["id"], "L1")
    assert find_image(STORE, "bbb222bbb222") == (STORE[1]["id"], "L2")
    assert find_image(STORE, "ghcr.io/modelpool/modelpool-operator:0.1.0") is None
    assert find_image(STORE, "modelpool-base") is None  # :latest is not :bookworm
    assert find_image([], "anything") is None


def test_image_config_reads_oci_then_docker_config() -> None:
    inspect = {
        "OCIv1": {
            "config": {
                "User": "10001:10001",
                "Env": ["PATH=/app/bin:/usr/bin", "A=1=2"],
                "Entrypoint": ["modelpool-operator"],
                "Cmd": ["--standalone"],
                "WorkingDir": "/app",
            }
        }
    }
    cfg = image_config(inspect)
    assert cfg == ImageConfig(
        ("modelpool-operator",), ("--standalone",), "10001:10001", ("PATH=/app/bin:/usr/bin", "A=1=2"), "/app"
    )
    assert image_config({"Docker": {"config": {"Cmd": ["sh"]}}}).cmd == ("sh",)
    assert image_config({}) == ImageConfig()
    assert image_env(cfg) == {"PATH": "/app/bin:/usr/bin", "A": "1=2"}
    assert image_env(ImageConfig()) == {"PATH": DEFAULT_PATH}


# -- entrypoint / cmd ---------------------------------------------------------------------------------------
IMAGE = ImageConfig(entrypoint=("/entry", "-x"), cmd=("default-arg",))


@pytest.mark.parametrize(
    ("container", "argv"),
    [
        ({}, ["/entry", "-x", "default-arg"]),  # neither: Entrypoint + Cmd
        ({"args": ["a", "$(V)"]}, ["/entry", "-x", "a", "v!"]),  # args: Entrypoint + args
        ({"command": ["run", "$(V)"]}, ["run", "v!"]),  # command: the image's Cmd is not used
        ({"command": ["run"], "args": ["b", "$(NOPE)", "$$(V)"]}, ["run", "b", "$(NOPE)", "$(V)"]),
    ],
)
def test_container_argv_follows_kubernetes_rules(container: JSON, argv: list[str]) -> None:
    assert container_argv(IMAGE, container, {"V": "v!"}) == argv


def test_container_argv_without_any_command_is_a_config_error() -> None:
    with pytest.raises(SpecError, match="no command"):
        container_argv(ImageConfig(), {}, {})
    # The image's own values are never expanded.
    assert container_argv(ImageConfig(cmd=("$(V)",)), {}, {"V": "x"}) == ["$(V)"]


# -- user ---------------------------------------------------------------------------------------------------
PASSWD = "root:x:0:0:root:/root:/bin/bash\n# comment\nmodelpool:x:10001:10001::/home/modelpool:/bin/sh\n"
GROUP = "root:x:0:\nmodelpool:x:10001:\nstaff:x:50:\n"


def test_resolve_user_from_the_image() -> None:
    assert resolve_user("", {}, {}) == User(0, 0, (), "/")
    assert resolve_user("10001", {}, {}, PASSWD, GROUP) == User(10001, 10001, (), "/home/modelpool")
    assert resolve_user("modelpool", {}, {}, PASSWD, GROUP) == User(10001, 10001, (), "/home/modelpool")
    assert resolve_user("modelpool:staff", {}, {}, PASSWD, GROUP).gid == 50
    assert resolve_user("4242:7", {}, {}, PASSWD, GROUP) == User(4242, 7, (), "/")
    with pytest.raises(SpecError, match="unable to find user"):
        resolve_user("nobody-here", {}, {}, PASSWD, GROUP)
    with pytest.raises(SpecError, match="unable to find group"):
        resolve_user("10001:nogroup", {}, {}, PASSWD, GROUP)


def test_resolve_user_security_context_wins_container_over_pod() -> None:
    pod = {
        "spec": {
            "securityContext": {
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "fsGroup": 10001,
                "supplementalGroups": [50, 10001],
            }
        }
    }
    assert resolve_user("", pod, {}, PASSWD, GROUP) == User(10001, 10001, (10001, 50), "/home/modelpool")
    container = {"securityContext": {"runAsUser": 7, "runAsGroup": 8}}
    assert resolve_user("10001", pod, container, PASSWD, GROUP) == User(7, 8, (10001, 50), "/")
    with pytest.raises(SpecError, match="runAsNonRoot"):
        resolve_user("root", {"spec": {"securityContext": {"runAsNonRoot": True}}}, {}, PASSWD, GROUP)
    assert resolve_user("10001", {"spec": {"securityContext": {"runAsNonRoot": True}}}, {}).uid == 10001
    assert parse_passwd("bad\nx:y:notanumber\n") == {}


# -- the OCI config -----------------------------------------------------------------------------------------
def test_oci_config_shape() -> None:
    cfg = oci_config(
        rootfs=Path("/pods/u/containers/c/rootfs"),
        read_only=True,
        user=User(10001, 10001, (10001, 50)),
        argv=["python", "-m", "x"],
        env={"PATH": "/usr/bin", "POD_IP": "127.42.1.1"},
        cwd="/app",
        hostname="worker-0",
        binds=[Bind(Path("/v/models"), "/models", True), Bind(Path("/v/tmp"), "/tmp")],
    )
    assert cfg["root"] == {"path": "/pods/u/containers/c/rootfs", "readonly": True}
    proc = cfg["process"]
    assert proc["user"] == {"uid": 10001, "gid": 10001, "additionalGids": [10001, 50]}
    assert proc["args"] == ["python", "-m", "x"]
    assert proc["env"] == ["PATH=/usr/bin", "POD_IP=127.42.1.1"]
    assert proc["cwd"] == "/app" and proc["terminal"] is False
    assert "rlimits" not in proc and proc["capabilities"]["effective"] == []  # not root: no capabilities
    assert cfg["hostname"] == "worker-0"
    linux = cfg["linux"]
    assert sorted(n["type"] for n in linux["namespaces"]) == ["ipc", "mount", "pid", "uts"]
    assert "cgroupsPath" not in linux and "resources" not in linux
    by_dest = {m["destination"]: m for m in cfg["mounts"]}
    assert {"/proc", "/dev", "/dev/shm", "/sys", "/models", "/tmp"} <= set(by_dest)
    assert by_dest["/proc"]["type"] == "proc"
    assert by_dest["/sys"]["type"] == "bind" and "ro" in by_dest["/sys"]["options"]
    assert all(m["type"] != "cgroup" for m in cfg["mounts"])
    assert by_dest["/models"] == {
        "destination": "/models",
        "type": "bind",
        "source": "/v/models",
        "options": ["rbind", "rprivate", "ro"],
    }
    assert "rw" in by_dest["/tmp"]["options"]
    root_cfg = oci_config(
        rootfs=Path("/r"),
        read_only=False,
        user=User(0, 0),
        argv=["sh"],
        env={},
        cwd="/",
        hostname="h",
        binds=[],
    )
    assert (
        root_cfg["root"]["readonly"] is False
        and "CAP_CHOWN" in root_cfg["process"]["capabilities"]["effective"]
    )
    with pytest.raises(ValueError, match="command"):
        oci_config(
            rootfs=Path("/r"),
            read_only=False,
            user=User(0, 0),
            argv=[],
            env={},
            cwd="/",
            hostname="h",
            binds=[],
        )
    with pytest.raises(ValueError, match="absolute"):
        oci_config(
            rootfs=Path("/r"),
            read_only=False,
            user=User(0, 0),
            argv=["sh"],
            env={},
            cwd="app",
            hostname="h",
            binds=[],
        )


def test_bind_mounts_put_parents_first() -> None:
    mounts = bind_mounts([Bind(Path("/a"), "/data/x/y"), Bind(Path("/b"), "/data")])
    assert [m["destination"] for m in mounts] == ["/data", "/data/x/y"]


def test_runc_argv_ids_and_names() -> None:
    runc = Runc(Path("/run/processnode/n/runc"), binary="/usr/sbin/runc")
    assert runc.run_argv(Path("/b"), "id1") == [
        "/usr/sbin/runc",
        "--root",
        "/run/processnode/n/runc",
        "run",
        "--bundle",
        "/b",
        "id1",
    ]
    assert runc.exec_argv("id1", ["cat", "/ready"], {"A": "1"}) == [
        "/usr/sbin/runc",
        "--root",
        "/run/processnode/n/runc",
        "exec",
        "--env",
        "A=1",
        "id1",
        "cat",
        "/ready",
    ]
    root = state_root("process-node-1", Path("/a/pods"))
    assert root.parent.parent == Path("/run/processnode") and root.name == "runc"
    assert root.parent.name.startswith("process-node-1-")
    assert state_root("process-node-1", Path("/b/pods")) != root  # another cluster's agent: another root
    assert state_root("process-node-1", Path("/a/pods")) == root
    assert container_id("0f-uid", "server/x y") == "0f-uid-server-x-y"
    assert hostname_of("a" * 70) == "a" * 63
    assert hostname_of("pod-.") == "pod"


def test_mounts_under_lists_deepest_first() -> None:
    info = (
        "22 1 8:1 / / rw - ext4 /dev/vda rw\n"
        "90 22 0:40 / /pods/u/containers/c/rootfs rw - overlay overlay rw,lowerdir=/l\n"
        "91 90 0:41 / /pods/u/containers/c/rootfs/proc rw - proc proc rw\n"
        "92 22 0:42 / /pods/u2/containers/c/rootfs rw - overlay overlay rw\n"
        "93 22 0:43 / /pods/u\\040x rw - tmpfs tmpfs rw\n"
    )
    assert mounts_under(info, Path("/pods/u")) == [
        "/pods/u/containers/c/rootfs/proc",
        "/pods/u/containers/c/rootfs",
    ]
    assert mounts_under(info, Path("/pods/u x")) == ["/pods/u x"]


def test_image_binds_and_hosts_file() -> None:
    container = {
        "volumeMounts": [
            {"name": "m", "mountPath": "/models/", "readOnly": True},
            {"name": "t", "mountPath": "/tmp"},
        ],
        "terminationMessagePath": "/var/log/msg",
    }
    table = {"/models": Path("/h/m"), "/tmp": Path("/h/t")}
    binds = image_binds(container, table, Path("/logs/c.termination-log"), Path("/pod/etc-hosts"))
    assert binds == [
        Bind(Path("/h/m"), "/models", True),
        Bind(Path("/h/t"), "/tmp", False),
        Bind(Path("/logs/c.termination-log"), "/var/log/msg", False),
        Bind(Path("/pod/etc-hosts"), "/etc/hosts", True),
    ]
    default = image_binds({}, {"/etc/hosts": Path("/x")}, Path("/t"), Path("/pod/etc-hosts"))
    # The pod's own /etc/hosts volume wins over the generated file.
    assert default == [Bind(Path("/x"), "/etc/hosts"), Bind(Path("/t"), "/dev/termination-log")]
    assert hosts_file("127.42.0.7", "w-0").splitlines()[-1] == "127.42.0.7\tw-0"


def test_mount_table_allows_nested_binds_in_image_mode() -> None:
    container = {"volumeMounts": [{"name": "a", "mountPath": "/data"}, {"name": "b", "mountPath": "/data/x"}]}
    dirs = {"a": Path("/h/a"), "b": Path("/h/b")}
    with pytest.raises(SpecError, match="nested"):
        mount_table(container, dirs, {})
    assert mount_table(container, dirs, {}, nested=True) == {"/data": Path("/h/a"), "/data/x": Path("/h/b")}


# -- projected, configMap and downward API volumes -----------------------------------------------------------
POD: JSON = {
    "metadata": {
        "name": "op-0",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"b": "2", "a": "1"},
        "annotations": {"k": 'v "q"'},
    },
    "spec": {
        "serviceAccountName": "modelpool-operator",
        "containers": [{"name": "c", "resources": {"limits": {"memory": "1Gi", "cpu": "1500m"}}}],
        "securityContext": {"fsGroup": 10001},
    },
}
B64 = base64.b64encode
# Only root may hand a file to another group: elsewhere the test's own group stands for the fsGroup.
FS_GROUP = 10001 if os.geteuid() == 0 else os.getegid()
POD["spec"]["securityContext"]["fsGroup"] = FS_GROUP


def test_downward_values() -> None:
    assert downward_value(POD, {"fieldRef": {"fieldPath": "metadata.namespace"}}) == b"ns"
    assert downward_value(POD, {"fieldRef": {"fieldPath": "metadata.labels"}}) == b'a="1"\nb="2"'
    assert downward_value(POD, {"fieldRef": {"fieldPath": "metadata.labels['b']"}}) == b"2"
    cpu = {"resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}}
    assert downward_value(POD, cpu) == b"1500"
    assert (
        downward_value(POD, {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}) == b"1024"
    )
    with pytest.raises(SpecError):
        downward_value(POD, {"path": "x"})


def kube_api_access() -> JSON:
    """The projected volume the ServiceAccount admission plugin adds to every pod."""
    return {
        "name": "kube-api-access-x1",
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }


def test_token_request_is_bound_to_the_pod() -> None:
    assert token_request(POD, {"expirationSeconds": 3607, "audience": "api"}) == {
        "expirationSeconds": 3607,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "op-0", "uid": "u-1"},
        "audiences": ["api"],
    }
    assert token_request(POD, {})["expirationSeconds"] == 3600
    assert fs_group(POD) == FS_GROUP and fs_group({}) is None


def test_projected_files_of_the_kube_api_access_volume() -> None:
    minted: list[tuple[str, str, JSON]] = []

    def mint(namespace: str, account: str, spec: JSON) -> str:
        minted.append((namespace, account, spec))
        return "tok"

    get = {"/api/v1/namespaces/ns/configmaps/kube-root-ca.crt": {"data": {"ca.crt": "PEM"}}}.get
    files = projected_files("v", kube_api_access(), POD, "ns", get=get, mint=mint)
    assert files == [("token", b"tok", None), ("ca.crt", b"PEM", None), ("namespace", b"ns", None)]
    assert minted[0][:2] == ("ns", "modelpool-operator")
    with pytest.raises(VolumeError, match=r"kube-root-ca\.crt"):
        projected_files("v", kube_api_access(), POD, "ns", get=api({}), mint=mint)
    secret_src = {
        "projected": {
            "sources": [
                {"secret": {"name": "s", "items": [{"key": "k", "path": "d/k", "mode": 0o400}]}},
                {"secret": {"name": "absent", "optional": True}},
            ]
        }
    }
    got = projected_files(
        "v",
        secret_src,
        POD,
        "ns",
        get={"/api/v1/namespaces/ns/secrets/s": {"data": {"k": B64(b"x").decode()}}}.get,
        mint=mint,
    )
    assert got == [("d/k", b"x", 0o400)]
    cm = {"configMap": {"name": "c"}}
    both = {
        "/api/v1/namespaces/ns/configmaps/c": {"data": {"b": "2"}, "binaryData": {"a": B64(b"\x00").decode()}}
    }
    assert projected_files("v", cm, POD, "ns", get=both.get, mint=mint) == [
        ("a", b"\x00", None),
        ("b", b"2", None),
    ]
    with pytest.raises(VolumeError, match="not supported"):
        projected_files(
            "v", {"projected": {"sources": [{"clusterTrustBundle": {}}]}}, POD, "ns", get=get, mint=mint
        )


def test_projected_volumes_are_written_only_in_image_mode(tmp_path: Path) -> None:
    get = {"/api/v1/namespaces/ns/configmaps/kube-root-ca.crt": {"data": {"ca.crt": "PEM"}}}.get
    pod = {
        **POD,
        "spec": {**POD["spec"], "volumes": [kube_api_access(), {"name": "scratch", "emptyDir": {}}]},
    }
    host_mode = pod_volume_dirs(pod, tmp_path / "h", get)
    assert sorted(host_mode) == ["scratch"]  # as before: no projected volume for host processes
    assert (tmp_path / "h" / "volumes" / "scratch").stat().st_mode & 0o777 == 0o777
    dirs = pod_volume_dirs(pod, tmp_path / "i", get, lambda ns, sa, spec: "tok")
    access = dirs["kube-api-access-x1"]
    assert (access / "token").read_text() == "tok"
    assert (access / "ca.crt").read_text() == "PEM"
    assert (access / "namespace").read_text() == "ns"
    info = (access / "token").stat()
    assert info.st_gid == FS_GROUP and info.st_mode & 0o777 == 0o644 | 0o040  # fsGroup owns it
    assert volume_source({"name": "c", "configMap": {"name": "x"}}, "ns", tmp_path, get) is None


def test_image_mode_is_off_unless_asked() -> None:
    default = parse_args(["--kubeconfig", "k"])
    assert default.run_images is False
    on = parse_args(["--kubeconfig", "k", "--run-images", "--image-store", "/srv/store"])
    assert on.run_images is True and on.image_store == "/srv/store"
    assert parse_args(["--kubeconfig", "k", "--run-images"]).image_store == "/var/lib/containers/storage"


def test_an_absent_image_fails_the_test_with_run_make_images() -> None:
    with pytest.raises(pytest.fail.Exception, match="run make images"):
        require_images(["ghcr.io/modelpool/never-built:0.0.0"])
    assert project_images()["operator"].startswith("ghcr.io/modelpool/modelpool-operator:")
