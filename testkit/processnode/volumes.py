"""Pod volumes on the process node: each volume is a host directory, and each container sees its mounts
through a root directory of its own plus one path-rewrite rule, because a container here is a plain
process on the host's filesystem (no mount namespace, no privileges to create /models on the host).

Layout under the agent's --pods-dir, per pod (removed when the pod is deleted):

    <pod uid>/volumes/<volume>                  an emptyDir's storage
    <pod uid>/root/<container>/<mountPath>      a symlink to the volume's directory (or its subPath)

The rule (`ContainerView.rewrite`): an absolute path in a container's command, args, env values or
workingDir that is a mountPath, lies under one, or is a parent directory of one (other than `/`) is
replaced by `<root>/<path>`; so are the same paths after `file://` and after the first `=` of a value
(`--model=/models/x`), except a path under a mountPath that exists on the host and not in the volume (a
host file handed to the pod, e.g. a model in a checkout under /tmp, where workers mount an emptyDir): it
stays as it is.  PROCESSNODE_ROOT names the container's root.  Paths a program builds in by
default (a server's default --pvc-root) are not seen: pass them explicitly.  The one exception is /tmp:
a container with a volume at /tmp and no TMPDIR of its own gets TMPDIR=/tmp (`with_tmpdir`), rewritten,
so that tempfile finds the volume as it would in a container (where /tmp *is* the volume).

Sources (`pod_volume_dirs`): emptyDir (a fresh directory), hostPath (the host path, with the `type`
checks and the *OrCreate creation the kubelet does), persistentVolumeClaim (PVC -> its bound PV ->
`spec.hostPath.path` or `spec.local.path`; an unbound claim is an error the worker retries, as the
kubelet keeps such a pod in ContainerCreating), secret (its keys written as files, `secret_source`).
For pods run from their images (image mode, `oci.py`) also configMap, downwardAPI and projected volumes
(`projected_files`: secret, configMap, downwardAPI and serviceAccountToken sources, the token minted by
a TokenRequest bound to the pod), so the admission-injected kube-api-access volume gives the container
its ServiceAccount's token, the cluster's CA (the kube-root-ca.crt ConfigMap) and its namespace; with
an fsGroup their files belong to that group.  An emptyDir is world-writable, as the kubelet makes it.
Host-mode pods do not get these three types (their processes use the agent's KUBECONFIG as before).
Other volume types are not mounted.  In image mode the mount table below is bound into the container
at each mountPath (real bind mounts); the symlink root and the rewrite rule are host mode's.

`readOnly` and `readOnlyRootFilesystem`: a container without a read-only root has the agent's own
permissions everywhere.  One with `securityContext.readOnlyRootFilesystem` runs in a mount namespace of
its own (`rootfs`) where the host's filesystem is read-only but for the host paths of its mounts that are
not `readOnly` (`writable_paths`), its mount root and its log files.
"""

from __future__ import annotations

import base64
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from testkit.processnode.oci import unmount_under
from testkit.processnode.podspec import SpecError, expand, field_ref, resource_field

JSON = dict[str, Any]
# GET an API path -> the object, or None when it does not exist (KubeError on any other failure).
Getter = Callable[[str], "JSON | None"]
ROOT_ENV = "PROCESSNODE_ROOT"
FILE_URI = "file://"


class VolumeError(Exception):
    """A volume cannot be set up yet: the pod waits in ContainerCreating with a FailedMount event."""

    def __init__(self, volume: str, message: str) -> None:
        self.volume = volume
        self.message = message
        super().__init__(f"MountVolume.SetUp failed for volume {volume!r}: {message}")


# -- sources: volume -> host directory --------------------------------------------------------------------
@dataclass(frozen=True)
class HostSource:
    """Where a volume lives on the host and what the kubelet checks or creates before mounting it."""

    path: Path
    check: str  # a hostPath `type` ("" = no check); an emptyDir is "DirectoryOrCreate"


def volume_source(
    volume: JSON,
    namespace: str,
    pod_dir: Path,
    get: Getter,
    *,
    pod: JSON | None = None,
    mint: Minter | None = None,
) -> HostSource | None:
    """The host source of one pod volume, or None for a type the process node does not mount."""
    name = str(volume["name"])
    if "emptyDir" in volume:
        return HostSource(pod_dir / "volumes" / name, "EmptyDir")
    if "hostPath" in volume:
        host = volume["hostPath"]
        return HostSource(Path(str(host["path"])), str(host.get("type") or ""))
    if "persistentVolumeClaim" in volume:
        claim = str(volume["persistentVolumeClaim"]["claimName"])
        return claim_source(name, namespace, claim, get)
    if "secret" in volume:
        # Image mode (mint): the container's user may not be root; its fsGroup reads the files.
        group = fs_group(pod or {}) if mint is not None else None
        return secret_source(name, namespace, volume["secret"], pod_dir, get, group=group)
    if mint is not None and ("configMap" in volume or "downwardAPI" in volume or "projected" in volume):
        files = projected_files(name, volume, pod or {}, namespace, get=get, mint=mint)
        mode = int(
            (volume.get("projected") or volume.get("configMap") or volume.get("downwardAPI") or {}).get(
                "defaultMode"
            )
            or 0o644
        )
        return HostSource(
            write_files(name, pod_dir / "volumes" / name, files, mode, fs_group(pod or {})), "Directory"
        )
    return None


def secret_source(
    volume: str, namespace: str, source: JSON, pod_dir: Path, get: Getter, *, group: int | None = None
) -> HostSource:
    """A Secret's keys (``items``: those, at their paths; else every key) written as files into a directory
    of the pod's, read-only (``defaultMode``), as the kubelet projects them; with ``group`` (the pod's
    fsGroup) owned by that group and group-readable."""
    name = str(source["secretName"])
    secret = get(f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(name)}")
    if secret is None:
        raise VolumeError(volume, f'secret "{name}" not found')
    data = secret.get("data") or {}
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    directory = pod_dir / "volumes" / volume
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    for item in items:
        key, rel = str(item["key"]), str(item["path"])
        if key not in data:
            raise VolumeError(volume, f'secret "{name}" has no key {key!r}')
        if posixpath.isabs(rel) or ".." in rel.split("/"):
            raise VolumeError(volume, f"secret item path {rel!r} must be relative within the volume")
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(data[key]))
        mode = int(item.get("mode") or source.get("defaultMode") or 0o644) | 0o400
        if group is not None:
            os.chown(target, -1, group)
            mode |= 0o040
        target.chmod(mode)
    return HostSource(directory, "Directory")


# One file of a projected volume: (path in the volume, content, mode or None for the volume's default).
ProjectedFile = tuple[str, bytes, "int | None"]
# TokenRequest: (namespace, service account, TokenRequest spec) -> the token (raises VolumeError).
Minter = Callable[[str, str, JSON], str]


def _items(volume: str, what: str, data: Mapping[str, bytes], source: JSON) -> list[ProjectedFile]:
    """A Secret's or ConfigMap's keys as files: ``items`` (those keys, at their paths) or every key."""
    items = source.get("items") or [{"key": key, "path": key} for key in sorted(data)]
    out: list[ProjectedFile] = []
    for item in items:
        key = str(item["key"])
        if key not in data:
            if source.get("optional"):
                continue
            raise VolumeError(volume, f"{what} has no key {key!r}")
        out.append((str(item["path"]), data[key], item.get("mode")))
    return out


def downward_value(pod: JSON, item: JSON) -> bytes:
    """Pure: one downward API file's content (a pod field, or a container's resource)."""
    if "fieldRef" in item:
        path = str(item["fieldRef"].get("fieldPath", ""))
        meta = pod.get("metadata") or {}
        if path in ("metadata.labels", "metadata.annotations"):
            values = meta.get(path.split(".")[1]) or {}
            return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items())).encode()
        return field_ref(pod, path, "", "").encode()
    if "resourceFieldRef" in item:
        ref = item["resourceFieldRef"]
        name = str(ref.get("containerName") or "")
        containers = (pod.get("spec") or {}).get("containers") or []
        container = next(
            (c for c in containers if c.get("name") == name), containers[0] if containers else {}
        )
        group, _, resource = str(ref.get("resource", "")).partition(".")
        raw = str(((container.get("resources") or {}).get(group) or {}).get(resource, "0"))
        return resource_field(raw, str(ref.get("divisor") or "1")).encode()
    raise SpecError("CreateContainerConfigError", f"downward API item {item.get('path')!r} has no source")


def projected_files(
    volume: str, spec: JSON, pod: JSON, namespace: str, *, get: Getter, mint: Minter
) -> list[ProjectedFile]:
    """The files of a configMap, downwardAPI or projected volume (secret, configMap, downwardAPI and
    serviceAccountToken sources), as the kubelet writes them.  Raises VolumeError (the pod waits)."""
    if "configMap" in spec:
        sources = [{"configMap": spec["configMap"]}]
    elif "downwardAPI" in spec:
        sources = [{"downwardAPI": spec["downwardAPI"]}]
    else:
        sources = list((spec.get("projected") or {}).get("sources") or [])
    files: list[ProjectedFile] = []
    for source in sources:
        if "configMap" in source or "secret" in source:
            kind = "configMap" if "configMap" in source else "secret"
            ref = source[kind]
            name = str(ref.get("name") or ref.get("secretName") or "")
            plural = "configmaps" if kind == "configMap" else "secrets"
            obj = get(f"/api/v1/namespaces/{quote(namespace)}/{plural}/{quote(name)}")
            if obj is None:
                if ref.get("optional"):
                    continue
                raise VolumeError(volume, f'{kind.lower()} "{name}" not found')
            data: dict[str, bytes]
            if kind == "secret":
                data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
            else:
                data = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
                data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
            files += _items(volume, f'{kind.lower()} "{name}"', data, ref)
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                try:
                    files.append((str(item["path"]), downward_value(pod, item), item.get("mode")))
                except SpecError as err:
                    raise VolumeError(volume, err.message) from err
        elif "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            account = str((pod.get("spec") or {}).get("serviceAccountName") or "default")
            request = token_request(pod, token)
            files.append(
                (str(token.get("path") or "token"), mint(namespace, account, request).encode(), None)
            )
        else:
            raise VolumeError(
                volume, f"projected source {sorted(source)} is not supported by the process node"
            )
    return files


def token_request(pod: JSON, token: JSON) -> JSON:
    """Pure: the TokenRequest spec of a projected serviceAccountToken, bound to the pod as the kubelet
    binds it (the token dies with the pod)."""
    meta = pod.get("metadata") or {}
    spec: JSON = {
        "expirationSeconds": int(token.get("expirationSeconds") or 3600),
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        },
    }
    if token.get("audience"):
        spec["audiences"] = [str(token["audience"])]
    return spec


def fs_group(pod: JSON) -> int | None:
    """Pure: the pod's fsGroup: the group that owns its volumes' files (None: none set)."""
    value = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    return None if value is None else int(value)


def write_files(
    volume: str, directory: Path, files: list[ProjectedFile], mode: int, group: int | None
) -> Path:
    """Write a projected volume's files (replacing what an earlier start wrote); with an fsGroup they are
    owned by that group and group-readable, as the kubelet makes them.  Returns the directory."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o755, parents=True)
    for rel, content, item_mode in files:
        if posixpath.isabs(rel) or ".." in rel.split("/"):
            raise VolumeError(volume, f"item path {rel!r} must be relative within the volume")
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        file_mode = int(item_mode if item_mode is not None else mode)
        if group is not None:
            os.chown(target, -1, group)
            file_mode |= 0o040
        target.chmod(file_mode)
    return directory


def claim_source(volume: str, namespace: str, claim: str, get: Getter) -> HostSource:
    """PVC -> bound PV -> its hostPath or local path (the only PV kinds a local process can reach)."""
    pvc = get(f"/api/v1/namespaces/{quote(namespace)}/persistentvolumeclaims/{quote(claim)}")
    if pvc is None:
        raise VolumeError(volume, f'persistentvolumeclaim "{claim}" not found')
    pv_name = str((pvc.get("spec") or {}).get("volumeName") or "")
    if (pvc.get("status") or {}).get("phase") != "Bound" or not pv_name:
        raise VolumeError(volume, f"error processing PVC {namespace}/{claim}: PVC is not bound")
    pv = get(f"/api/v1/persistentvolumes/{quote(pv_name)}")
    if pv is None:
        raise VolumeError(volume, f'persistentvolume "{pv_name}" (bound to {namespace}/{claim}) not found')
    spec = pv.get("spec") or {}
    if "hostPath" in spec:
        return HostSource(Path(str(spec["hostPath"]["path"])), str(spec["hostPath"].get("type") or ""))
    if "local" in spec:
        # A local PV is a path that must already exist (the local volume plugin creates nothing).
        return HostSource(Path(str(spec["local"]["path"])), "Exists")
    raise VolumeError(
        volume,
        f"persistentvolume {pv_name!r} is neither hostPath nor local: the process node cannot mount it",
    )


_KINDS = {
    "Directory": (stat.S_ISDIR, "a directory"),
    "File": (stat.S_ISREG, "a file"),
    "Socket": (stat.S_ISSOCK, "a socket"),
    "CharDevice": (stat.S_ISCHR, "a character device"),
    "BlockDevice": (stat.S_ISBLK, "a block device"),
}


def prepare(volume: str, source: HostSource) -> Path:
    """The kubelet's hostPath type check (creating a *OrCreate path); returns the directory to mount."""
    path, check = source.path, source.check
    if check == "EmptyDir":
        # World-writable, as the kubelet makes an emptyDir: the container may run as any user.
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        return path
    if check == "DirectoryOrCreate":
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
    elif check == "FileOrCreate" and not path.exists():
        try:
            path.touch(mode=0o644)
        except OSError as err:
            raise VolumeError(volume, f"hostPath type check failed: cannot create {path}: {err}") from err
    want = check.removesuffix("OrCreate")
    if want in _KINDS:
        test, what = _KINDS[want]
        try:
            ok = test(path.stat().st_mode)
        except OSError:
            ok = False
        if not ok:
            raise VolumeError(volume, f"hostPath type check failed: {path} is not {what}")
    elif want == "Exists" and not path.exists():
        raise VolumeError(volume, f"path {path} does not exist")
    return path


def pod_volume_dirs(pod: JSON, pod_dir: Path, get: Getter, mint: Minter | None = None) -> dict[str, Path]:
    """Every mountable volume of the pod, set up: volume name -> host path.  Raises VolumeError.  With
    ``mint`` (image mode) configMap, downwardAPI and projected volumes too."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    dirs: dict[str, Path] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        source = volume_source(volume, namespace, pod_dir, get, pod=pod, mint=mint)
        if source is not None:
            dirs[str(volume["name"])] = prepare(str(volume["name"]), source)
    return dirs


def remove_pod_dir(pod_dir: Path) -> None:
    """Delete a pod's emptyDirs and mount links (after detaching its containers' overlay roots).  rmtree
    unlinks symlinks without following them, so a hostPath or PV directory behind a link is never touched."""
    unmount_under(pod_dir)
    shutil.rmtree(pod_dir, ignore_errors=True)


# -- mounts: what one container sees ----------------------------------------------------------------------
def normalize_path(path: str) -> str:
    """An absolute, normalized path (normpath alone keeps a leading `//`, which POSIX allows)."""
    return posixpath.normpath("/" + path.lstrip("/"))


def mount_table(
    container: JSON, volume_dirs: Mapping[str, Path], env: Mapping[str, str], *, nested: bool = False
) -> dict[str, Path]:
    """Pure: the container's mountPath -> host path (with subPath / subPathExpr), for mounted volumes.
    Raises SpecError for what a process cannot be given (a subPath leaving its volume; nested mounts,
    unless ``nested``: bind mounts in image mode nest as in any container)."""
    table: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        host = volume_dirs.get(str(mount["name"]))
        if host is None:
            continue  # a volume type the process node does not mount
        sub = str(mount.get("subPath") or "")
        if mount.get("subPathExpr"):
            sub = expand(str(mount["subPathExpr"]), env)
        if sub:
            if posixpath.isabs(sub) or ".." in sub.split("/"):
                raise SpecError(
                    "CreateContainerConfigError", f"subPath {sub!r} must be a relative path within its volume"
                )
            host = host / sub
        table[normalize_path(str(mount["mountPath"]))] = host
    for path in [] if nested else table:
        for other in table:
            if other.startswith(path.rstrip("/") + "/"):
                raise SpecError(
                    "CreateContainerConfigError",
                    f"nested volume mounts ({path}, {other}) are not supported by the process node",
                )
    return table


TMP = "/tmp"


def with_tmpdir(env: Mapping[str, str], base: Mapping[str, str], table: Mapping[str, Path]) -> dict[str, str]:
    """Pure: ``env`` with TMPDIR=/tmp when the container mounts a volume at /tmp and set no TMPDIR of its
    own (its value is the agent's, from ``base``, or none)."""
    out = dict(env)
    if TMP in table and out.get("TMPDIR") == base.get("TMPDIR"):
        out["TMPDIR"] = TMP
    return out


def writable_paths(container: JSON, table: Mapping[str, Path]) -> list[Path]:
    """Pure: the host paths of the container's mounts (``mount_table``) that are not ``readOnly``."""
    read_only = {
        normalize_path(str(m["mountPath"])) for m in container.get("volumeMounts") or [] if m.get("readOnly")
    }
    return [host for mount, host in table.items() if mount not in read_only]


def read_only_root(container: JSON) -> bool:
    """Does the container ask for a read-only root filesystem?"""
    return bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem"))


@dataclass(frozen=True)
class ContainerView:
    """One container's view of its mounts: `root` holds a symlink at each mountPath."""

    root: Path
    mounts: Mapping[str, Path]

    def host_path(self, path: str) -> str | None:
        """The host path behind container path `path`, or None when no mount covers it."""
        if not path.startswith("/"):
            return None
        norm = normalize_path(path)
        if norm == "/":
            return None
        for mount, host in self.mounts.items():
            if norm.startswith(mount + "/") and _host_file_outside(norm, mount, host):
                return None
            if norm == mount or norm.startswith(mount + "/") or mount.startswith(norm + "/"):
                return str(self.root) + norm + ("/" if path.endswith("/") else "")
        return None

    def rewrite(self, value: str) -> str:
        """The rule: a path value, a `file://` path, or the path after a value's first `=`."""
        mapped = self.host_path(value)
        if mapped is not None:
            return mapped
        if value.startswith(FILE_URI):
            mapped = self.host_path(value[len(FILE_URI) :])
            return value if mapped is None else FILE_URI + mapped
        key, eq, rest = value.partition("=")
        if eq and not key.startswith("/"):
            tail = self.rewrite(rest) if rest.startswith(("/", FILE_URI)) else rest
            return key + eq + tail
        return value

    def rewrite_env(self, env: Mapping[str, str], base: Mapping[str, str]) -> dict[str, str]:
        """The pod's own values rewritten; the agent's (`base`: PATH, HOME, ...) are host paths already."""
        out = {k: v if base.get(k) == v else self.rewrite(v) for k, v in env.items()}
        out[ROOT_ENV] = str(self.root)
        return out


def _host_file_outside(path: str, mount: str, host: Path) -> bool:
    """`path` (under `mount`) names a file that exists on the host and not in the volume: a host file the
    pod was handed on purpose (a test's model directory in a checkout under /tmp, where a worker's /tmp
    emptyDir is mounted), which the process, sharing the host's filesystem, can read where it is."""
    inside = host / path[len(mount) + 1 :]
    return os.path.lexists(path) and not os.path.lexists(inside)


def materialize(view: ContainerView) -> None:
    """Create the container's root with one symlink per mount (replacing links left by a previous run)."""
    view.root.mkdir(parents=True, exist_ok=True)
    for mount, host in view.mounts.items():
        link = Path(str(view.root) + mount)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)
        if not host.exists():
            # A missing subPath (or untyped hostPath) becomes a directory, as the kubelet and Docker make it.
            host.mkdir(parents=True, exist_ok=True)
        os.symlink(host, link, target_is_directory=host.is_dir())
