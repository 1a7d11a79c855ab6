"""One container of one pod as a local process: start, probe, exit, restart with back-off, stop.

A ContainerRunner is driven by its pod's worker thread (`tick`), never by two threads, so its record
needs no lock.  Each run is its own process group (start_new_session), so SIGTERM/SIGKILL reach every
process the container started.

Image mode (``PodContext.pod_images`` set by the worker): the run is ``runc run`` of a bundle built by
``_prepare_image`` (``oci.py``): the image's root under an overlay, its entrypoint/cmd under the
container's command/args, its env under the pod's, its user, the volumes bound at their mountPaths.
Signals go through ``runc kill`` and exec probes through ``runc exec``; the status's container id is
``runc://<id>``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from testkit.processnode.images import Image, ImageStore, container_argv, image_env, resolve_user
from testkit.processnode.oci import Bind, Overlay, Runc, container_id, hostname_of, oci_config
from testkit.processnode.podspec import (
    Lookup,
    SpecError,
    backoff_delay,
    build_argv,
    build_env,
    exit_code_of,
    should_restart,
)
from testkit.processnode.podstatus import ContainerRecord, Terminated
from testkit.processnode.probes import ProbeState, run_probe
from testkit.processnode.rootfs import can_enforce, wrapper_argv
from testkit.processnode.volumes import (
    ContainerView,
    Getter,
    Minter,
    materialize,
    mount_table,
    normalize_path,
    read_only_root,
    with_tmpdir,
    writable_paths,
)

JSON = dict[str, Any]
log = logging.getLogger("processnode.container")

FALLBACK_LINES = 80  # FallbackToLogsOnError: the kubelet keeps the last 80 lines / 2048 bytes
FALLBACK_BYTES = 2048
TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # the Kubernetes default


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@dataclass
class PodContext:
    """What every container of a pod shares; `pod` is refreshed by the worker on each update."""

    pod: JSON
    pod_ip: str
    host_ip: str
    base_env: Mapping[str, str]
    termination_log_envs: list[str]
    lookup: Lookup
    log_dir: Path  # <agent log dir>/<namespace>/<pod>
    default_cwd: Path
    backoff_initial: float
    backoff_max: float
    pod_dir: Path  # <agent pods dir>/<pod uid>: emptyDirs and each container's mount root
    get: Getter  # API objects the pod's volumes refer to (PVC, PV)
    node_name: str = ""
    # Volume name -> host path, filled in by the pod's worker once every volume is set up.
    volume_dirs: dict[str, Path] = field(default_factory=dict)
    # Image mode (the agent's --run-images): the store, runc, the TokenRequest client and the variables
    # every container from an image gets (POD_IP, the bind variables, KUBERNETES_SERVICE_HOST/PORT).
    images: ImageStore | None = None
    runc: Runc | None = None
    mint: Minter | None = None
    image_base_env: Mapping[str, str] = field(default_factory=dict)
    # Container name -> its image, set by the worker when every container's image is in the store (the
    # pod then runs from its images); empty: the pod's containers run as host processes.
    pod_images: dict[str, Image] = field(default_factory=dict)


@dataclass(frozen=True)
class Launch:
    """Everything one run of a container needs, with the pod's paths mapped to this container's view."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    view: ContainerView
    # Image mode: runc's bundle (config.json and the overlay root) and the container's runc id.
    bundle: Path | None = None
    cid: str = ""


def image_binds(
    container: JSON, table: Mapping[str, Path], termination_log: Path, hosts: Path | None
) -> list[Bind]:
    """Pure: the bind mounts of a container run from its image: each volume mount at its mountPath
    (read-only when the mount says so), the termination-log file at terminationMessagePath and the
    pod's /etc/hosts (when the container mounts nothing there)."""
    read_only = {
        normalize_path(str(m["mountPath"])) for m in container.get("volumeMounts") or [] if m.get("readOnly")
    }
    binds = [Bind(host, mount, mount in read_only) for mount, host in table.items()]
    message_path = normalize_path(str(container.get("terminationMessagePath") or TERMINATION_MESSAGE_PATH))
    binds.append(Bind(termination_log, message_path))
    if hosts is not None and "/etc/hosts" not in table:
        binds.append(Bind(hosts, "/etc/hosts", read_only=True))
    return binds


def hosts_file(pod_ip: str, hostname: str) -> str:
    """Pure: the pod's /etc/hosts, as the kubelet writes it (loopback names and the pod's own name)."""
    return (
        "# Kubernetes-managed hosts file (the process node).\n"
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{pod_ip}\t{hostname}\n"
    )


class ContainerRunner:
    def __init__(self, spec: JSON, ctx: PodContext, clock: Callable[[], float], restart_count: int = 0):
        self.spec = spec
        self.ctx = ctx
        self._clock = clock
        self.record = ContainerRecord(name=str(spec["name"]), image=str(spec.get("image", "")))
        self.record.restart_count = restart_count
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_offset = 0
        self._env: dict[str, str] = {}
        self._view: ContainerView | None = None
        self._launch: Launch | None = None
        self._started_mono = 0.0
        self._next_start = 0.0
        self._failures = 0
        self._kill_at: float | None = None
        self._launched = False
        self._startup: ProbeState | None = None
        self._readiness: ProbeState | None = None
        self._liveness: ProbeState | None = None

    # -- paths ---------------------------------------------------------------------------------------------
    @property
    def log_path(self) -> Path:
        return self.ctx.log_dir / f"{self.record.name}.log"

    @property
    def termination_log_path(self) -> Path:
        return self.ctx.log_dir / f"{self.record.name}.termination-log"

    @property
    def running(self) -> bool:
        return self.proc is not None

    # -- the loop --------------------------------------------------------------------------------------------
    def tick(self, stopping: bool) -> None:
        now = self._clock()
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is None:
                if self._kill_at is not None and now >= self._kill_at:
                    self._signal(signal.SIGKILL)
                    self._kill_at = None
                elif not stopping and self._kill_at is None:
                    self._probe(now)
                return
            self._exited(rc, now, stopping)
            return
        if stopping or self.record.final:
            return
        if now >= self._next_start:
            self._start(now)

    def stop(self, grace: float) -> None:
        """SIGTERM now, SIGKILL after `grace` seconds (checked by tick)."""
        self.record.ready = False
        if self.proc is None:
            return
        self._signal(signal.SIGTERM)
        deadline = self._clock() + max(grace, 0.0)
        self._kill_at = deadline if self._kill_at is None else min(self._kill_at, deadline)

    def kill(self) -> None:
        """SIGKILL at once (the pod is gone or the agent is leaving)."""
        if self.proc is not None:
            self._signal(signal.SIGKILL)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("container %s: process %d survived SIGKILL", self.record.name, self.proc.pid)
            self._exited(self.proc.returncode or -9, self._clock(), True)

    # -- transitions -----------------------------------------------------------------------------------------
    @property
    def image(self) -> Image | None:
        """The image this container runs from (image mode), or None (a host process)."""
        return self.ctx.pod_images.get(self.record.name)

    def _prepare_image(self, image: Image) -> Launch:
        """Image mode: the next run's runc bundle: the image's entrypoint/cmd under the container's
        command/args, the image's env under the pod's, its user, the volumes bound at their mountPaths."""
        ctx = self.ctx
        assert ctx.runc is not None
        meta = ctx.pod.get("metadata") or {}
        base = {**image_env(image.config), **ctx.image_base_env}
        message_path = str(self.spec.get("terminationMessagePath") or TERMINATION_MESSAGE_PATH)
        for name in ctx.termination_log_envs:
            base[name] = message_path
        env = build_env(ctx.pod, self.spec, base, pod_ip=ctx.pod_ip, host_ip=ctx.host_ip, lookup=ctx.lookup)
        argv = container_argv(image.config, self.spec, env)
        table = mount_table(self.spec, ctx.volume_dirs, env, nested=True)
        etc = image.rootfs / "etc"
        user = resolve_user(
            image.config.user, ctx.pod, self.spec, _read(etc / "passwd"), _read(etc / "group")
        )
        env.setdefault("HOME", user.home)
        hostname = hostname_of(str(meta.get("name") or "pod"))
        env.setdefault("HOSTNAME", hostname)
        hosts = ctx.pod_dir / "etc-hosts"
        bundle = ctx.pod_dir / "containers" / self.record.name
        cwd = str(self.spec.get("workingDir") or image.config.working_dir or "/")
        try:
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(hosts_file(ctx.pod_ip, hostname))
            self.termination_log_path.parent.mkdir(parents=True, exist_ok=True)
            self.termination_log_path.write_bytes(b"")
            self.termination_log_path.chmod(0o666)  # the container's user writes it
            config = oci_config(
                rootfs=bundle / "rootfs",
                read_only=read_only_root(self.spec),
                user=user,
                argv=argv,
                env=env,
                cwd=cwd,
                hostname=hostname,
                binds=image_binds(self.spec, table, self.termination_log_path, hosts),
            )
            Overlay(bundle, image.rootfs).mount()
            ctx.runc.write_bundle(bundle, config)
        except (OSError, ValueError) as err:
            raise SpecError("CreateContainerError", f"cannot create the container: {err}") from err
        cid = container_id(str(meta.get("uid") or ""), self.record.name)
        view = ContainerView(bundle / "rootfs", table)
        return Launch(ctx.runc.run_argv(bundle, cid), env, ctx.pod_dir, view, bundle, cid)

    def _prepare(self) -> Launch:
        """argv, environment and working directory of the next run (raises SpecError).  `$(VAR)` is
        expanded with the container's own paths; the mount rule then maps each value to the host."""
        ctx = self.ctx
        if self.image is not None:
            return self._prepare_image(self.image)
        base = dict(ctx.base_env)
        for name in ctx.termination_log_envs:
            base[name] = str(self.termination_log_path)
        env = build_env(ctx.pod, self.spec, base, pod_ip=ctx.pod_ip, host_ip=ctx.host_ip, lookup=ctx.lookup)
        argv = build_argv(self.spec, env)
        table = mount_table(self.spec, ctx.volume_dirs, env)
        view = ContainerView(ctx.pod_dir / "root" / self.record.name, table)
        env = with_tmpdir(env, base, table)
        try:
            materialize(view)
        except OSError as err:
            raise SpecError("CreateContainerConfigError", f"cannot mount volumes: {err}") from err
        wd = view.rewrite(str(self.spec.get("workingDir") or ""))
        cwd = Path(wd) if wd and Path(wd).is_dir() else ctx.default_cwd
        return Launch([view.rewrite(a) for a in argv], view.rewrite_env(env, base), cwd, view)

    def _command(self, launch: Launch) -> list[str]:
        """The process to start: the container's argv, through ``rootfs`` when its root is read-only.
        Raises OSError (a StartError) for an executable that cannot be found, as Popen would."""
        if launch.bundle is not None:
            return launch.argv  # runc run: the image's root is read-only by its config
        if not read_only_root(self.spec):
            return launch.argv
        if not can_enforce():
            log.warning(
                "container %s: readOnlyRootFilesystem not enforced (the agent is not root)", self.record.name
            )
            return launch.argv
        program = launch.argv[0]
        found = (
            shutil.which(program, path=launch.env.get("PATH", os.defpath))
            if "/" not in program
            else shutil.which(os.path.join(launch.cwd, program))
        )
        if found is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        writable = [
            *(str(p) for p in writable_paths(self.spec, launch.view.mounts)),
            str(launch.view.root),
            str(self.termination_log_path),
            str(self.log_path),
        ]
        return wrapper_argv(sys.executable, writable, launch.argv)

    def _start(self, now: float) -> None:
        ctx = self.ctx
        try:
            launch = self._prepare()
        except SpecError as err:
            # The kubelet retries a config error (a missing ConfigMap may appear); so do we.
            self.record.state = "waiting"
            self.record.waiting_reason = err.reason
            self.record.waiting_message = err.message
            self._next_start = now + 5.0
            return
        argv, env, cwd = launch.argv, launch.env, launch.cwd
        self._env = env
        self._view = launch.view
        self._launch = launch
        ctx.log_dir.mkdir(parents=True, exist_ok=True)
        if launch.bundle is None:
            self.termination_log_path.write_bytes(b"")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - owned until the process exits
        self._log_offset = self._log.tell()
        if self._launched:
            self.record.restart_count += 1
        self._launched = True
        started = datetime.now(UTC)
        try:
            self.proc = subprocess.Popen(
                self._command(launch),
                # runc itself runs in the agent's environment; the container's is in its config.json.
                env=env if launch.bundle is None else dict(os.environ),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as err:
            # What a container runtime reports for an executable it cannot start.
            self._log.close()
            self._log = None
            term = Terminated(128, "StartError", f"failed to start {argv[0]!r}: {err}", started, started, "")
            self.record.ever_ran = True
            self._finish(term, now, stopping=False, ran_for=0.0)
            return
        log.info("container %s started: pid %d: %s", self.record.name, self.proc.pid, argv)
        self._started_mono = now
        self._kill_at = None
        rec = self.record
        rec.state = "running"
        rec.started_at = started
        rec.container_id = f"runc://{launch.cid}" if launch.cid else f"process://{self.proc.pid}"
        rec.ever_ran = True
        rec.waiting_message = ""
        self._startup = self._probe_state("startupProbe", now)
        self._readiness = self._probe_state("readinessProbe", now)
        self._liveness = self._probe_state("livenessProbe", now)
        rec.started = self._startup is None
        rec.ready = rec.started and self._readiness is None

    def _probe_state(self, which: str, now: float) -> ProbeState | None:
        spec = self.spec.get(which)
        if not spec:
            return None
        launch = self._launch
        if "exec" in spec and launch is not None and launch.cid and self.ctx.runc is not None:
            # An exec probe from an image runs in the container: `runc exec`, as its user, in its env.
            command = self.ctx.runc.exec_argv(launch.cid, [str(a) for a in spec["exec"].get("command") or []])
            spec = {**spec, "exec": {**spec["exec"], "command": command}}
        elif "exec" in spec and self._view is not None:
            # An exec probe runs in the container too: its paths follow the same mount rule.
            command = [self._view.rewrite(str(a)) for a in spec["exec"].get("command") or []]
            spec = {**spec, "exec": {**spec["exec"], "command": command}}
        return ProbeState(spec, now)

    def _probe(self, now: float) -> None:
        rec = self.record
        if self._startup is not None and not rec.started:
            if self._startup.due(now):
                self._startup.record(self._run(self._startup), now)
                if self._startup.passed:
                    rec.started = True
                    # Readiness and liveness start counting once the startup probe has passed.
                    for probe in (self._readiness, self._liveness):
                        if probe is not None:
                            probe.next_at = now
                elif self._startup.failed:
                    self._kill_for_probe("startup", self._startup)
            return
        if self._liveness is not None and self._liveness.due(now):
            self._liveness.record(self._run(self._liveness), now)
            if self._liveness.failed:
                self._kill_for_probe("liveness", self._liveness)
                return
        if self._readiness is None:
            rec.ready = True
        elif self._readiness.due(now):
            self._readiness.record(self._run(self._readiness), now)
            rec.ready = self._readiness.passed

    def _run(self, probe: ProbeState) -> bool:
        env = self._env if self._launch is None or not self._launch.cid else dict(os.environ)
        return run_probe(probe.spec, self.spec, self.ctx.pod_ip, env, probe.timeout)

    def _kill_for_probe(self, which: str, probe: ProbeState) -> None:
        log.info("container %s failed its %s probe: restarting", self.record.name, which)
        grace = probe.spec.get("terminationGracePeriodSeconds")
        if grace is None:
            grace = (self.ctx.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        self.stop(float(grace))

    def _exited(self, rc: int, now: float, stopping: bool) -> None:
        assert self.proc is not None
        pid = self.proc.pid
        # Anything left in the container's process group goes with it, as with a container's cgroup.
        self._signal(signal.SIGKILL)
        self.proc = None
        launch = self._launch
        if launch is not None and launch.bundle is not None and self.ctx.runc is not None:
            # runc run removes its container when the init exits; make sure, then free the overlay root.
            self.ctx.runc.delete(launch.cid)
            Overlay(launch.bundle, launch.bundle).unmount()
        if self._log is not None:
            self._log.close()
            self._log = None
        code = exit_code_of(rc)
        message = self._termination_message(code)
        started = self.record.started_at or datetime.now(UTC)
        term = Terminated(
            code,
            "Completed" if code == 0 else "Error",
            message,
            started,
            datetime.now(UTC),
            f"runc://{launch.cid}" if launch is not None and launch.cid else f"process://{pid}",
        )
        log.info("container %s exited with %d", self.record.name, code)
        self._finish(term, now, stopping, now - self._started_mono)

    def _finish(self, term: Terminated, now: float, stopping: bool, ran_for: float) -> None:
        rec = self.record
        rec.ready = False
        rec.started = False
        policy = str((self.ctx.pod.get("spec") or {}).get("restartPolicy", "Always"))
        if not stopping and should_restart(policy, term.exit_code):
            if ran_for > 2 * self.ctx.backoff_max:
                self._failures = 0  # a long healthy run forgives earlier crashes, as the kubelet does
            self._failures += 1
            delay = backoff_delay(self._failures, self.ctx.backoff_initial, self.ctx.backoff_max)
            meta = self.ctx.pod.get("metadata") or {}
            rec.last_terminated = term
            rec.terminated = None
            rec.state = "waiting"
            rec.waiting_reason = "CrashLoopBackOff"
            rec.waiting_message = (
                f"back-off {delay:g}s restarting failed container={rec.name} "
                f"pod={meta.get('name')}_{meta.get('namespace')}({meta.get('uid')})"
            )
            self._next_start = now + delay
        else:
            if rec.state == "terminated" and rec.terminated is not None:
                rec.last_terminated = rec.terminated
            rec.state = "terminated"
            rec.terminated = term
            rec.final = True

    def _termination_message(self, code: int) -> str:
        try:
            message = self.termination_log_path.read_bytes()[:4096].decode("utf-8", "replace").strip()
        except OSError:
            message = ""
        if message or code == 0 or self.spec.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return message
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                lines = f.read().splitlines()[-FALLBACK_LINES:]
        except OSError:
            return ""
        return b"\n".join(lines)[-FALLBACK_BYTES:].decode("utf-8", "replace")

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        launch = self._launch
        # runc's container is in a session and pid namespace of its own: signal its init through runc
        # (SIGKILL to pid 1 ends every process of the container).  When runc finds no container (not
        # created yet, or gone), the signal goes to runc's own process group (runc forwards SIGTERM).
        runc = self.ctx.runc
        if launch is not None and launch.cid and runc is not None and runc.kill(launch.cid, sig.name):
            return
        # Its process group, unless its leader is reaped and its pid is a live process's again: a group's
        # id is never reused while any member lives, so a live process of that pid means the group is
        # empty and the pid another's (pid_max is 32768: under load it comes round in minutes).
        if self.proc.poll() is not None and Path(f"/proc/{self.proc.pid}").exists():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
