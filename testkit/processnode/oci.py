"""Running a container from its image on the process node: an OCI runtime config (``oci_config``, pure)
and Debian's ``runc`` driven around it (``Runc``), with the image's root under an overlay (``Overlay``).

The container gets namespaces of its own for mounts, pids, IPC and the host name only: no network
namespace (it binds the pod's loopback address in the machine's network namespace, as every process-node
pod does), no user namespace, no cgroup namespace and no cgroup (``cgroupsPath`` unset, no resources, no
rlimits: this machine's hybrid cgroups and rlimit policy are what made podman and crun fail here).

Its root is an overlay: the image's top vfs layer (its whole file system) as the lower directory, an
upper and a work directory in the pod's directory (``<pod dir>/containers/<name>/``), fresh at every
start (a restarted container gets a new writable layer, as with a container engine).  So the image is
never written: neither by a writable root, nor by runc creating the mount points of the pod's volumes.
With ``readOnlyRootFilesystem`` the root is made read-only (``root.readonly``) once runc has mounted
everything.  The pod's volumes are bind mounts at their mountPaths; the termination-log file is bound at
``terminationMessagePath``.

runc's container process runs in a session of its own and its init is pid 1 of the container's pid
namespace: signals go through ``runc kill`` (killing pid 1 ends every process of the container), and the
container is removed with ``runc delete --force``.  ``runc run`` in the foreground stays the agent's child
and exits with the container's status; each node's containers live under a ``--root`` of its own
(``state_root``), so an agent that starts deletes every container a dead predecessor left there.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.processnode.images import User

JSON = dict[str, Any]
log = logging.getLogger("processnode.oci")
RUNC_STATE_ROOT = Path("/run/processnode")
MNT_DETACH = 2
# The capabilities a container engine grants by default (Docker's / containerd's list).
DEFAULT_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]


@dataclass(frozen=True)
class Bind:
    """One bind mount into the container."""

    source: Path
    destination: str
    read_only: bool = False


def state_root(node_name: str, pods_dir: Path) -> Path:
    """Pure: runc's ``--root`` for one node's containers: by the node's name and its pods directory, so
    the agents of two clusters on one machine (concurrent test sessions, each with its own
    process-node-images) never see, nor delete, each other's containers."""
    digest = hashlib.sha256(str(pods_dir).encode()).hexdigest()[:12]
    return RUNC_STATE_ROOT / f"{node_name}-{digest}" / "runc"


def container_id(pod_uid: str, container: str) -> str:
    """Pure: the runc id of a pod's container (runc allows letters, digits, ``_ + - .``)."""
    safe = "".join(c if c.isalnum() or c in "_+-." else "-" for c in container)
    return f"{pod_uid}-{safe}"


def base_mounts() -> list[JSON]:
    """Pure: what every container has besides its volumes (runc spec's defaults, without cgroup)."""
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=1g"],
        },
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        # sysfs cannot be mounted without a network namespace of one's own: bind the host's, read-only.
        {
            "destination": "/sys",
            "type": "bind",
            "source": "/sys",
            "options": ["rbind", "nosuid", "noexec", "nodev", "ro"],
        },
    ]


def bind_mounts(binds: Sequence[Bind]) -> list[JSON]:
    """Pure: the pod's volumes (and the termination-log file) as OCI bind mounts, parents first."""
    out = []
    for bind in sorted(binds, key=lambda b: b.destination.count("/")):
        options = ["rbind", "rprivate", "ro" if bind.read_only else "rw"]
        out.append(
            {"destination": bind.destination, "type": "bind", "source": str(bind.source), "options": options}
        )
    return out


def oci_config(
    *,
    rootfs: Path,
    read_only: bool,
    user: User,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    hostname: str,
    binds: Sequence[Bind],
) -> JSON:
    """Pure: the runc ``config.json`` of one container run (runc spec's shape; see the module docstring)."""
    if not argv:
        raise ValueError("a container needs a command")
    if not cwd.startswith("/"):
        raise ValueError(f"the working directory must be absolute: {cwd!r}")
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            "user": {"uid": user.uid, "gid": user.gid, "additionalGids": list(user.additional_gids)},
            "args": list(argv),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": cwd,
            "capabilities": {
                "bounding": DEFAULT_CAPS,
                "effective": DEFAULT_CAPS if user.uid == 0 else [],
                "permitted": DEFAULT_CAPS if user.uid == 0 else [],
            },
            "noNewPrivileges": False,
        },
        "root": {"path": str(rootfs), "readonly": read_only},
        "hostname": hostname,
        "mounts": [*base_mounts(), *bind_mounts(binds)],
        "linux": {
            "namespaces": [{"type": "mount"}, {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}],
            "maskedPaths": [
                "/proc/acpi",
                "/proc/kcore",
                "/proc/keys",
                "/proc/latency_stats",
                "/proc/timer_list",
                "/proc/sched_debug",
                "/proc/scsi",
                "/sys/firmware",
            ],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def hostname_of(pod_name: str) -> str:
    """Pure: the pod's host name (its name, cut to a DNS label's 63 characters, as the kubelet does)."""
    return pod_name[:63].rstrip("-.") or "pod"


# -- effects ------------------------------------------------------------------------------------------------
class Overlay:
    """The container's root: an overlay of the image's layer under a fresh upper directory."""

    def __init__(self, bundle: Path, lower: Path) -> None:
        self.bundle = bundle
        self.lower = lower
        self.rootfs = bundle / "rootfs"

    def mount(self) -> None:
        self.unmount()
        for sub in ("upper", "work"):
            shutil.rmtree(self.bundle / sub, ignore_errors=True)
            (self.bundle / sub).mkdir(parents=True)
        self.rootfs.mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={self.lower},upperdir={self.bundle / 'upper'},workdir={self.bundle / 'work'}"
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b"overlay", str(self.rootfs).encode(), b"overlay", ctypes.c_ulong(0), options.encode()):
            err = ctypes.get_errno()
            raise OSError(err, f"mount overlay on {self.rootfs}: {os.strerror(err)}")

    def unmount(self) -> None:
        unmount_under(self.rootfs)


def _mount_points(mountinfo: str) -> list[str]:
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(fields[4].replace("\\040", " ").replace("\\134", "\\"))
    return points


def mounts_under(mountinfo: str, path: Path) -> list[str]:
    """Pure: the mount points at or below ``path`` in a mountinfo text, deepest first."""
    prefix = str(path).rstrip("/")
    found = [p for p in _mount_points(mountinfo) if p == prefix or p.startswith(prefix + "/")]
    return sorted(set(found), key=lambda p: -p.count("/"))


def unmount_under(path: Path) -> None:
    """Detach every mount at or below ``path`` (a container's overlay root) so the directory can go."""
    try:
        with open("/proc/self/mountinfo") as f:
            points = mounts_under(f.read(), path)
    except OSError:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for point in points:
        if libc.umount2(point.encode(), MNT_DETACH):
            log.warning("umount %s: %s", point, os.strerror(ctypes.get_errno()))


@dataclass(frozen=True)
class Runc:
    """``runc`` with one node's state root."""

    root: Path
    binary: str = "runc"

    def _argv(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.root), *args]

    def run_argv(self, bundle: Path, cid: str) -> list[str]:
        """Pure: the foreground ``runc run`` the agent starts as the container's process."""
        return self._argv("run", "--bundle", str(bundle), cid)

    def exec_argv(self, cid: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """Pure: ``runc exec`` of a command in the container (an exec probe), as its user, in its env."""
        extra: list[str] = []
        for key, value in (env or {}).items():
            extra += ["--env", f"{key}={value}"]
        return self._argv("exec", *extra, cid, *argv)

    def write_bundle(self, bundle: Path, config: JSON) -> None:
        bundle.mkdir(parents=True, exist_ok=True)
        tmp = bundle / "config.json.tmp"
        tmp.write_text(json.dumps(config, indent=1))
        tmp.replace(bundle / "config.json")

    def kill(self, cid: str, sig: str) -> bool:
        """Signal the container's init (pid 1 of its pid namespace: KILL ends all of it)."""
        done = subprocess.run(self._argv("kill", cid, sig), capture_output=True, timeout=30, check=False)
        return done.returncode == 0

    def delete(self, cid: str) -> None:
        subprocess.run(self._argv("delete", "--force", cid), capture_output=True, timeout=30, check=False)

    def state(self, cid: str) -> JSON | None:
        done = subprocess.run(self._argv("state", cid), capture_output=True, timeout=30, check=False)
        if done.returncode != 0:
            return None
        parsed: JSON = json.loads(done.stdout)
        return parsed

    def list_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        done = subprocess.run(
            self._argv("list", "--format", "json"), capture_output=True, timeout=30, check=False
        )
        if done.returncode != 0:
            return []
        return [str(c["id"]) for c in json.loads(done.stdout or "null") or []]

    def delete_all(self) -> list[str]:
        """Remove every container under this root (a previous agent's, left when it died), and unmount
        their roots.  Returns their ids."""
        ids = self.list_ids()
        for cid in ids:
            state = self.state(cid) or {}
            self.delete(cid)
            bundle = state.get("bundle")
            if bundle:
                unmount_under(Path(str(bundle)) / "rootfs")
        return ids


def usable() -> str:
    """Why image mode cannot run here ("" when it can): runc on PATH and root."""
    if shutil.which("runc") is None:
        return "runc is not installed (apt-get install runc)"
    if os.geteuid() != 0:
        return "image mode needs root (runc without a user namespace, overlay mounts)"
    return ""
