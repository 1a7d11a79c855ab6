"""A read-only root filesystem for one container of the process node (``readOnlyRootFilesystem``).

A container here is a host process, and the host's filesystem stands for its image's root.  When the
container asks for a read-only root, its process starts through this file, run as a script
(``python -I -S rootfs.py --rw PATH ... -- COMMAND ...``: standard library only, so neither the pod's
``PYTHON*`` environment nor a site directory changes what it does).  It

1. enters a new mount namespace (``unshare(CLONE_NEWNS)``; the agent runs as root) and makes every mount
   in it private, so nothing below reaches the host;
2. bind-mounts each writable path over itself (the container's writable volume directories, its mount
   root, its termination-log file, its log file): a bind is a mount of its own and keeps its write access
   when the mount it lies on turns read-only;
3. remounts read-only every mount that stands for the image's filesystem: all but ``/proc``, ``/sys`` and
   ``/dev`` (with ``/dev/shm``, which a real container has as a tmpfs of its own), keeping each mount's
   other flags (``nosuid``, ``nodev``...);
4. ``exec``s the command, which keeps the pid (the container's id, its process group) and the
   stdout/stderr the agent opened before the exec (they refer to the host's mounts, not the copies).

The namespace ends with the container's last process: nothing to unmount.  The pure parts
(``image_mounts``, ``mount_flags``, ``wrapper_argv``) are unit-tested; the effects are in ``main``.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
_FLAG_OPTIONS = {
    "ro": MS_RDONLY,
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
# The kernel's filesystems, as in a container: not part of the image, left as they are.
KEPT = ("/proc", "/sys", "/dev")
# What the script exits with when it cannot set the container up (the command never ran).
SETUP_FAILED = 126
EXEC_FAILED = 127


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_flags(options: str) -> int:
    """Pure: a mount's per-mount options (``rw,nosuid,relatime``) as ``MS_*`` flags."""
    flags = 0
    for option in options.split(","):
        flags |= _FLAG_OPTIONS.get(option, 0)
    return flags


def _kept(path: str) -> bool:
    return any(path == top or path.startswith(top + "/") for top in KEPT)


def image_mounts(mountinfo: str) -> list[tuple[str, int]]:
    """Pure: the mount points of ``/proc/self/mountinfo`` that stand for the image (all but ``KEPT``),
    each once with the flags of its topmost mount, in mountinfo's order (parents first)."""
    found: dict[str, int] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        point = _unescape(fields[4])
        if not _kept(point):
            found.pop(point, None)  # a mount stacked on the same point hides the one below
            found[point] = mount_flags(fields[5])
    return list(found.items())


def can_enforce() -> bool:
    """Only root may create a mount namespace and remount in it: an agent run by another user (a laptop's
    ``make cluster-up``) starts such containers as they are, and says so (``ContainerRunner``)."""
    return os.geteuid() == 0


def wrapper_argv(python: str, writable: Sequence[str], command: Sequence[str]) -> list[str]:
    """Pure: the command line that runs ``command`` with a read-only root and ``writable`` kept writable."""
    argv = [python, "-I", "-S", os.path.abspath(__file__)]
    for path in writable:
        argv += ["--rw", path]
    return [*argv, "--", *command]


def _parse(args: list[str]) -> tuple[list[str], list[str]]:
    writable: list[str] = []
    while args and args[0] == "--rw" and len(args) > 1:
        writable.append(args[1])
        args = args[2:]
    if not args or args[0] != "--" or len(args) < 2:
        raise SystemExit("usage: rootfs.py [--rw PATH]... -- COMMAND [ARG]...")
    return writable, args[1:]


class _Libc:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL(None, use_errno=True)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    def unshare(self, flags: int) -> None:
        self._check(self.lib.unshare(flags), "unshare(CLONE_NEWNS)")

    def mount(self, source: str | None, target: str, flags: int) -> None:
        src = None if source is None else source.encode()
        result = self.lib.mount(src, target.encode(), None, ctypes.c_ulong(flags), None)
        self._check(result, f"mount {source or ''} {target} (flags {flags:#x})")


def read_only_root(writable: Sequence[str]) -> None:
    """This process (and what it execs) enters a namespace where only ``writable`` and ``KEPT`` write."""
    libc = _Libc()
    libc.unshare(CLONE_NEWNS)
    libc.mount(None, "/", MS_REC | MS_PRIVATE)
    with open("/proc/self/mountinfo") as f:
        image = image_mounts(f.read())  # read before the binds below add mounts of their own
    for path in writable:
        real = os.path.realpath(path)
        if os.path.exists(real):
            libc.mount(real, real, MS_BIND)
    for point, flags in image:
        if flags & MS_RDONLY:
            continue
        libc.mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def main(args: list[str]) -> int:
    writable, command = _parse(args)
    try:
        read_only_root(writable)
    except OSError as err:
        print(f"processnode: cannot make the root filesystem read-only: {err}", file=sys.stderr)
        return SETUP_FAILED
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"processnode: exec {command[0]!r}: {err}", file=sys.stderr)
    return EXEC_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
