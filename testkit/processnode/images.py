"""Images for the process node's image mode: where a pod's image lives in the local store, what its OCI
config says, and how the Kubernetes rules combine it with the container's spec.

The store is buildah's containers/storage (``/var/lib/containers/storage``, the ``vfs`` driver, where
``make images`` builds).  With vfs every layer is a directory holding the *whole* file system up to that
layer, so an image's top layer (``vfs/dir/<layer id>``) is its root file system as it is: nothing is
copied or unpacked.  The image's name -> id -> top layer comes from ``vfs-images/images.json`` (read here,
no subprocess); its OCI config (Entrypoint, Cmd, User, Env, WorkingDir) from ``buildah inspect --type
image``, once per image id.

Pure parts (unit-tested): ``candidate_names``, ``find_image``, ``image_config``, ``container_argv``,
``parse_passwd``, ``resolve_user``, ``image_env``.  Effects: ``ImageStore``.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.processnode.podspec import SpecError, expand

JSON = dict[str, Any]
STORAGE_ROOT = Path("/var/lib/containers/storage")
STORAGE_DRIVER = "vfs"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_REGISTRY = "docker.io"


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's OCI config a container run needs."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""
    env: tuple[str, ...] = ()
    working_dir: str = ""


@dataclass(frozen=True)
class Image:
    """An image found in the store: its id, its root file system (the vfs top layer) and its config."""

    name: str
    id: str
    rootfs: Path
    config: ImageConfig


@dataclass(frozen=True)
class User:
    uid: int
    gid: int
    additional_gids: tuple[int, ...] = ()
    home: str = "/"


# -- pure ---------------------------------------------------------------------------------------------------
def candidate_names(reference: str) -> list[str]:
    """Pure: the names an image reference can have in the store, as container engines normalize them:
    ``:latest`` when no tag or digest is given; a reference without a registry host is tried as
    ``localhost/<name>`` (where buildah names local builds) and as Docker Hub's ``docker.io[/library]``."""
    ref = reference.strip()
    if not ref:
        return []
    name, at, digest = ref.partition("@")
    last = name.rsplit("/", 1)[-1]
    if not at and ":" not in last:
        name += ":latest"
    full = name + (at + digest if at else "")
    first, slash, _ = full.partition("/")
    has_host = bool(slash) and ("." in first or ":" in first or first == "localhost")
    if has_host:
        return [full]
    out = [full, f"localhost/{full}", f"{DEFAULT_REGISTRY}/{full}"]
    if not slash:
        out.append(f"{DEFAULT_REGISTRY}/library/{full}")
    return out


def find_image(images: Sequence[JSON], reference: str) -> tuple[str, str] | None:
    """Pure: (image id, top layer id) of the store entry (``images.json``) a reference names, or None.
    A digest reference (``name@sha256:...``) matches the image's manifest digest; an id (or a unique
    prefix of at least 12 hex digits) matches the id."""
    wanted = candidate_names(reference)
    for entry in images:
        names = entry.get("names") or []
        if any(n in names for n in wanted):
            return str(entry["id"]), str(entry.get("layer") or "")
    _, at, digest = reference.partition("@")
    for entry in images:
        digests = {str(entry.get("digest") or ""), *(str(d) for d in entry.get("digests") or [])}
        if at and digest in digests:
            return str(entry["id"]), str(entry.get("layer") or "")
    ref = reference.removeprefix("sha256:")
    if len(ref) >= 12 and all(c in "0123456789abcdef" for c in ref):
        hits = [e for e in images if str(e.get("id", "")).startswith(ref)]
        if len(hits) == 1:
            return str(hits[0]["id"]), str(hits[0].get("layer") or "")
    return None


def image_config(inspect: JSON) -> ImageConfig:
    """Pure: the config of ``buildah inspect --type image`` output (its ``OCIv1.config``, else Docker's)."""
    cfg = ((inspect.get("OCIv1") or {}).get("config")) or ((inspect.get("Docker") or {}).get("config")) or {}
    return ImageConfig(
        entrypoint=tuple(str(a) for a in cfg.get("Entrypoint") or []),
        cmd=tuple(str(a) for a in cfg.get("Cmd") or []),
        user=str(cfg.get("User") or ""),
        env=tuple(str(e) for e in cfg.get("Env") or []),
        working_dir=str(cfg.get("WorkingDir") or ""),
    )


def container_argv(config: ImageConfig, container: JSON, env: Mapping[str, str]) -> list[str]:
    """Pure: the process's argv by Kubernetes' rules: ``command`` replaces the image's Entrypoint (and then
    its Cmd is not used), ``args`` replaces its Cmd; ``$(VAR)`` in command and args is expanded with the
    container's environment (never in the image's own values)."""
    command = [expand(str(a), env) for a in container.get("command") or []]
    args = container.get("args")
    argv = [*(command or config.entrypoint)]
    if args:
        argv += [expand(str(a), env) for a in args]
    elif not command:
        argv += config.cmd
    if not argv:
        raise SpecError(
            "CreateContainerConfigError", "no command specified: neither the container nor its image has one"
        )
    return argv


def parse_passwd(text: str) -> dict[str, tuple[int, int, str]]:
    """Pure: ``/etc/passwd`` (or ``/etc/group``: name:x:gid:...) as name -> (id, primary gid, home)."""
    out: dict[str, tuple[int, int, str]] = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) < 3 or line.startswith("#"):
            continue
        try:
            uid = int(parts[2])
            gid = int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else uid
        except ValueError:
            continue
        out[parts[0]] = (uid, gid, parts[5] if len(parts) > 5 else "/")
    return out


def _security(pod: JSON, container: JSON, key: str) -> Any:
    """A container's securityContext value, falling back to the pod's (the container's wins)."""
    own = (container.get("securityContext") or {}).get(key)
    if own is not None:
        return own
    return ((pod.get("spec") or {}).get("securityContext") or {}).get(key)


def resolve_user(image_user: str, pod: JSON, container: JSON, passwd: str = "", group: str = "") -> User:
    """Pure: the container's uid/gid: runAsUser/runAsGroup (container, else pod) over the image's USER
    (``uid``, ``name``, ``uid:gid`` or ``name:group``, looked up in the image's /etc/passwd and /etc/group);
    fsGroup and supplementalGroups as additional groups.  runAsNonRoot with uid 0 is refused, as the
    kubelet refuses it."""
    users, groups = parse_passwd(passwd), parse_passwd(group)
    name, _, group_part = image_user.partition(":")
    uid, gid, home = 0, 0, "/"
    if name:
        if name.isdigit():
            uid = int(name)
            known = next((v for v in users.values() if v[0] == uid), None)
            gid, home = (known[1], known[2]) if known else (0, "/")
        elif name in users:
            uid, gid, home = users[name]
        else:
            raise SpecError("CreateContainerConfigError", f"unable to find user {name}: no matching entries")
    if group_part:
        if group_part.isdigit():
            gid = int(group_part)
        elif group_part in groups:
            gid = groups[group_part][0]
        else:
            raise SpecError("CreateContainerConfigError", f"unable to find group {group_part}")
    run_as = _security(pod, container, "runAsUser")
    if run_as is not None:
        uid = int(run_as)
        known = next((v for v in users.values() if v[0] == uid), None)
        home = known[2] if known else "/"
        if not group_part:
            gid = known[1] if known else 0
    run_group = _security(pod, container, "runAsGroup")
    if run_group is not None:
        gid = int(run_group)
    if _security(pod, container, "runAsNonRoot") and uid == 0:
        raise SpecError("CreateContainerConfigError", "container has runAsNonRoot and image will run as root")
    pod_sc = (pod.get("spec") or {}).get("securityContext") or {}
    extra = [int(g) for g in pod_sc.get("supplementalGroups") or []]
    if pod_sc.get("fsGroup") is not None:
        extra.insert(0, int(pod_sc["fsGroup"]))
    additional = tuple(dict.fromkeys(extra))  # the primary group too, as container runtimes list it
    return User(uid=uid, gid=gid, additional_gids=additional, home=home or "/")


def image_env(config: ImageConfig) -> dict[str, str]:
    """Pure: the image's Env as a mapping, with a default PATH when the image sets none (as runtimes do)."""
    env: dict[str, str] = {}
    for item in config.env:
        key, _, value = item.partition("=")
        if key:
            env[key] = value
    env.setdefault("PATH", DEFAULT_PATH)
    return env


# -- effects ------------------------------------------------------------------------------------------------
@dataclass
class ImageStore:
    """The local containers/storage store, read for images by reference (thread-safe, configs cached)."""

    root: Path = STORAGE_ROOT
    driver: str = STORAGE_DRIVER
    buildah: str = "buildah"
    _configs: dict[str, ImageConfig] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _images(self) -> list[JSON]:
        path = self.root / f"{self.driver}-images" / "images.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        return data if isinstance(data, list) else []

    def layer_dir(self, layer: str) -> Path:
        return self.root / self.driver / "dir" / layer

    def lookup(self, reference: str) -> Image | None:
        """The image a pod names, when the store holds it (its top layer present), else None."""
        found = find_image(self._images(), reference)
        if found is None:
            return None
        image_id, layer = found
        rootfs = self.layer_dir(layer)
        if not layer or not rootfs.is_dir():
            return None
        return Image(name=reference, id=image_id, rootfs=rootfs, config=self.config(image_id))

    def config(self, image_id: str) -> ImageConfig:
        with self._lock:
            if image_id in self._configs:
                return self._configs[image_id]
        done = subprocess.run(
            [
                self.buildah,
                "--root",
                str(self.root),
                "--storage-driver",
                self.driver,
                "inspect",
                "--type",
                "image",
                image_id,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "STORAGE_DRIVER": self.driver},
        )
        if done.returncode != 0:
            raise SpecError("ErrImagePull", f"buildah inspect {image_id}: {done.stderr.strip()[-500:]}")
        config = image_config(json.loads(done.stdout))
        with self._lock:
            self._configs[image_id] = config
        return config
