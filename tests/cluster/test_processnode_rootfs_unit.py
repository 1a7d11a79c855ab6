"""The process node's read-only root (``readOnlyRootFilesystem``) without a cluster: which mounts stand for
the image and with which flags, which of a container's mounts stay writable, and the wrapper itself run
for real (a new mount namespace: writes outside the writable paths fail with EROFS, inside them and in
/dev/shm they succeed, the host's own mounts are untouched, stdout reaches a file opened before exec)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testkit.processnode.rootfs import (
    EXEC_FAILED,
    MS_NODEV,
    MS_NOSUID,
    MS_RDONLY,
    MS_RELATIME,
    image_mounts,
    mount_flags,
    wrapper_argv,
)
from testkit.processnode.volumes import mount_table, read_only_root, with_tmpdir, writable_paths

MOUNTINFO = """\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:5 / /proc rw,nosuid,nodev,noexec,relatime shared:2 - proc proc rw
24 22 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw
25 24 0:7 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw
26 22 0:8 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw
27 22 0:9 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw
28 22 0:10 / /mnt/with\\040space ro,relatime - tmpfs tmpfs rw
29 27 0:11 / /tmp rw,relatime - tmpfs tmpfs rw
30 22 0:12 / /devices rw - tmpfs tmpfs rw
"""


def test_image_mounts_are_all_but_the_kernels_with_the_topmost_flags() -> None:
    assert image_mounts(MOUNTINFO) == [
        ("/", MS_RELATIME),
        ("/mnt/with space", MS_RDONLY | MS_RELATIME),
        ("/tmp", MS_RELATIME),  # the mount stacked on /tmp hides the nosuid,nodev one below
        ("/devices", 0),  # /dev's siblings by prefix are not /dev
    ]


def test_mount_flags_keep_what_a_remount_must_not_drop() -> None:
    assert mount_flags("rw,nosuid,nodev,relatime") == MS_NOSUID | MS_NODEV | MS_RELATIME
    assert mount_flags("ro") == MS_RDONLY
    assert mount_flags("rw,unknown") == 0


def test_writable_paths_are_the_mounts_not_read_only(tmp_path: Path) -> None:
    container = {
        "name": "c",
        "securityContext": {"readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "weights", "mountPath": "/models//w/", "readOnly": True},
            {"name": "cache", "mountPath": "/cache", "subPath": "hf"},
        ],
    }
    dirs = {"scratch": tmp_path / "s", "weights": tmp_path / "w", "cache": tmp_path / "c"}
    table = mount_table(container, dirs, {})
    assert writable_paths(container, table) == [tmp_path / "s", tmp_path / "c" / "hf"]
    assert read_only_root(container)
    assert not read_only_root({"name": "c", "securityContext": {"runAsNonRoot": True}})
    assert not read_only_root({"name": "c"})


def test_a_volume_at_tmp_is_where_tempfile_writes_unless_the_container_says_otherwise(tmp_path: Path) -> None:
    table = {"/tmp": tmp_path / "tmp"}
    base = {"PATH": "/usr/bin", "TMPDIR": "/var/agent-tmp"}
    assert with_tmpdir(dict(base), base, table)["TMPDIR"] == "/tmp"  # rewritten to the volume later
    assert with_tmpdir({"PATH": "/usr/bin"}, {}, table)["TMPDIR"] == "/tmp"
    assert with_tmpdir({**base, "TMPDIR": "/scratch"}, base, table)["TMPDIR"] == "/scratch"
    assert with_tmpdir(dict(base), base, {"/data": tmp_path})["TMPDIR"] == "/var/agent-tmp"


# Run through the wrapper: each line says what a write at one path gave.
WRITER = """
import errno, sys
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        print(path, "ok")
    except OSError as err:
        print(path, errno.errorcode[err.errno])
"""


def test_the_wrapper_leaves_only_the_writable_paths_writable(tmp_path: Path) -> None:
    writable = tmp_path / "volume"
    writable.mkdir()
    termination = tmp_path / "termination-log"
    termination.write_text("")
    outside = tmp_path / "outside.txt"
    shm = Path("/dev/shm") / f"rootfs-test-{tmp_path.name}"
    log = tmp_path / "out.log"
    argv = wrapper_argv(
        sys.executable,
        [str(writable), str(termination)],
        [sys.executable, "-c", WRITER, str(outside), str(writable / "in.txt"), str(termination), str(shm)],
    )
    with open(log, "wb") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=60, check=False)
    report = log.read_text()
    assert done.returncode == 0, report
    assert report.splitlines() == [
        f"{outside} EROFS",
        f"{writable / 'in.txt'} ok",
        f"{termination} ok",
        f"{shm} ok",
    ]
    assert not outside.exists() and (writable / "in.txt").read_text() == "x"
    assert termination.read_text() == "x"
    shm.unlink()
    # Nothing reached the host's namespace: the test itself still writes where the pod could not.
    outside.write_text("the host is still writable")


def test_the_wrapper_reports_a_command_it_cannot_exec(tmp_path: Path) -> None:
    argv = wrapper_argv(sys.executable, [str(tmp_path)], [str(tmp_path / "no-such-program")])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == EXEC_FAILED
    assert "no-such-program" in done.stderr
