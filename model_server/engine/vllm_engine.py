"""The inference process of ``--engine vllm``: vLLM's OpenAI server, run as a child on a loopback port and
watched; the worker's lifecycle from what it says.

The supervisor starts this process in the inference process's place (``slot.inference_module``), so the
rest of the worker is unchanged: the HTTP processes keep the door (bounded admission, 429 with
Retry-After), the deadlines, the disconnect watch and the drain, and relay the OpenAI routes to vLLM
(``frontend.vllm_relay``), which they find on the port this process publishes (``Field.UPSTREAM_PORT``).
vLLM runs with ``--vllm-python`` (an environment of its own: it pins a transformers the server's does
not allow) in a session of its own (a signal to the pod's process group is the supervisor's to act on),
with SIGTERM and SIGINT back at their defaults and a parent-death signal (it dies with this process).

The states: Loading until vLLM's ``/health`` answers 200; then Processing while vLLM runs or queues a
request (``vllm:num_requests_running``/``waiting`` on its ``/metrics``) or one of ours is in the door,
Ready otherwise, Idle after ``--idle-after`` without work.  Every poll also publishes vLLM's figures into
the shared view (in flight, backlog, KV cache, the resident memory of its processes), where ``/stats``,
``/metrics`` and the endpoint picker's names read them.  vLLM exiting unasked fails the worker with its
exit and the last lines of its output: exit 3 (LoadFailed) while it loaded, 4 after.

How it ends: ``drain`` (SIGTERM): Evicting; once no request of ours is in the door and vLLM runs none,
vLLM is stopped (SIGTERM to its group, SIGKILL after ``STOP_WAIT_S``), Dead, exit 0; exit 6 when
``--drain-timeout`` passes first.  ``stop`` or the control pipe closing: vLLM stopped, exit 0.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import http.client
import logging
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import IO

from prometheus_client.parser import text_string_to_metric_families

from model_server.config import ServerConfig
from model_server.engine.sources import resolve
from model_server.libc import libc_function
from model_server.metrics import MULTIPROC_ENV, rss_bytes
from model_server.process_setup import exit_now, set_up
from model_server.state_machine import State, StateMachine
from model_server.worker_view import ENGINE_CODES, VLLM, Field, WorkerView
from modelpool_contract.exits import EXIT_DEVICE_FAILED, EXIT_DRAIN_TIMED_OUT, EXIT_LOAD_FAILED

log = logging.getLogger("modelpool.vllm")

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
LOOPBACK = "127.0.0.1"
# How often vLLM is looked at: its /health while it loads, its /metrics while it serves.
POLL_S = 0.25
HTTP_TIMEOUT_S = 2.0
# The last lines of vLLM's output kept for the reason of its failure.
TAIL_LINES = 30
# After SIGTERM to vLLM's process group, how long before SIGKILL (it stops in < 4 s on a CPU); twice this
# stays within the supervisor's STOP_TIMEOUT_S, so vLLM is gone before the supervisor kills this process.
STOP_WAIT_S = 4.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class VllmLoad:
    """What one scrape of vLLM's /metrics says (zeros for what it did not say)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    kv_tokens: float | None = None
    seconds_per_request: float | None = None


def vllm_command(config: ServerConfig, model_dir: Path, port: int) -> list[str]:
    """Pure: vLLM's OpenAI server for ``model_dir`` on the loopback ``port``, serving the model under our
    name (the relayed bodies name it), then ``--vllm-args``."""
    command = [str(config.vllm_python), "-m", VLLM_MODULE, "--model", str(model_dir)]
    command += ["--served-model-name", config.served_name, "--host", LOOPBACK, "--port", str(port)]
    # Its access log would log our every scrape of /health and /metrics (four a second).
    command.append("--disable-uvicorn-access-log")
    if config.dtype != "auto":
        command += ["--dtype", config.dtype]
    if config.trust_remote_code:
        command.append("--trust-remote-code")
    return command + shlex.split(config.vllm_args)


def vllm_environment(environ: Mapping[str, str], config: ServerConfig) -> dict[str, str]:
    """Pure: vLLM's environment: ours without the metrics directory (vLLM's prometheus-client would write
    its own series into our multiprocess files), with ``--hf-home`` when given, and its sockets between its
    processes named relative to its working directory (under TMPDIR, whose path may be longer than a
    unix socket's 107 bytes allow: a pod's on a node that runs pods as processes is)."""
    env = {key: value for key, value in environ.items() if key != MULTIPROC_ENV}
    env["VLLM_RPC_BASE_PATH"] = "."
    if config.hf_home is not None:
        env["HF_HOME"] = str(config.hf_home)
    return env


def parse_metrics(text: str) -> VllmLoad:
    """Pure: the figures we use from vLLM's Prometheus text (summed over its engines' series)."""
    sums: dict[str, float] = collections.defaultdict(float)
    kv_tokens: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] += sample.value
            if sample.name == "vllm:cache_config_info":
                kv_tokens = _cache_tokens(sample.labels)
    count = sums.get("vllm:e2e_request_latency_seconds_count", 0.0)
    per_request = sums["vllm:e2e_request_latency_seconds_sum"] / count if count else None
    return VllmLoad(
        running=sums.get("vllm:num_requests_running", 0.0),
        waiting=sums.get("vllm:num_requests_waiting", 0.0),
        kv_usage=sums.get("vllm:kv_cache_usage_perc", 0.0),
        kv_tokens=kv_tokens,
        seconds_per_request=per_request,
    )


def _cache_tokens(labels: Mapping[str, str]) -> float | None:
    """The KV cache's tokens from ``vllm:cache_config_info``'s labels (blocks x block size)."""
    try:
        return float(int(labels["num_gpu_blocks"]) * int(labels["block_size"]))
    except (KeyError, ValueError):
        return None


def next_state(state: State, busy: bool, quiet_s: float, idle_after: float) -> State | None:
    """Pure: where a serving worker goes from ``state`` (None: it stays).  Processing while there is work;
    Ready when it is done; Idle after ``idle_after`` quiet seconds."""
    if state in (State.READY, State.IDLE) and busy:
        return State.PROCESSING
    if state is State.PROCESSING and not busy:
        return State.READY
    if state is State.READY and quiet_s >= idle_after:
        return State.IDLE
    return None


def failure_reason(exitcode: int, tail: list[str], loading: bool) -> str:
    """Pure: why the worker failed when vLLM exited unasked: the exit, then its last lines of output that
    say something (a traceback's frames left out: the error they end in is what a reader needs)."""
    how = f"killed by signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"
    when = "while loading" if loading else "while serving"
    lines = " | ".join(telling_lines(tail))
    return f"vLLM exited {when} ({how}): {lines or 'no output'}"[:2000]


def telling_lines(lines: list[str]) -> list[str]:
    """Pure: ``lines`` stripped, without blanks, traceback headers, frames (``File "..."`` and the source
    line after it) and the carets under them."""
    kept: list[str] = []
    frame = False
    for line in lines:
        text = line.strip()
        if frame or not text or text.startswith("Traceback (") or set(text) <= set("^~ "):
            frame = False
            continue
        frame = text.startswith('File "')
        if not frame:
            kept.append(text)
    return kept


def free_port() -> int:
    """A loopback port free now (vLLM binds it a moment later: another process taking it in between
    makes vLLM fail to load, and the worker is replaced)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def tree_rss(pid: int) -> int:
    """The resident bytes of ``pid`` and every process below it (vLLM's API server and engine core)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += rss_bytes(current)
        todo += _children(current)
    return total


def _children(pid: int) -> list[int]:
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(child) for child in f.read().split()]
    return children


# Looked up here, never between fork and exec (a dlopen there could wait on a lock another thread held).
_PRCTL = libc_function("prctl", [ctypes.c_int, ctypes.c_ulong], ctypes.c_int)


def _in_child() -> None:
    """Run in vLLM's process before its exec: the stop signals back at their defaults (this process
    ignores them, and that survives exec) and death with this process (its parent-death signal)."""
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, signal.SIG_DFL)
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


# vLLM's guard: a small process that kills vLLM's whole group once this process is gone without stopping
# it (SIGKILLed: a second signal to the supervisor).  The parent-death signal reaches vLLM's API server
# only; its engine core, a child of that, would live on holding the model's memory.
GUARD = (
    "import os, sys, time\n"
    "parent, group = int(sys.argv[1]), int(sys.argv[2])\n"
    "while os.getppid() == parent:\n"
    "    time.sleep(0.5)\n"
    "try:\n"
    "    os.killpg(group, 9)\n"
    "except ProcessLookupError:\n"
    "    pass\n"
)


class VllmProcess:
    """vLLM's server process: started (with its guard), its output copied to ours (the last lines kept),
    stopped."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.workdir = tempfile.mkdtemp(prefix="vllm-")  # its working directory: its sockets are here
        self.popen = subprocess.Popen(
            command,
            env=env,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Only system calls between fork and exec, no lock taken: safe beside the resolve thread.
            preexec_fn=_in_child,  # noqa: PLW1509
        )
        assert self.popen.stdout is not None
        self._reader = threading.Thread(target=self._copy, args=(self.popen.stdout,), daemon=True, name="out")
        self._reader.start()
        guard = [sys.executable, "-c", GUARD, str(os.getpid()), str(self.popen.pid)]
        self.guard = subprocess.Popen(guard, stdin=subprocess.DEVNULL)

    def _copy(self, out: IO[bytes]) -> None:
        for raw in out:
            line = raw.decode("utf-8", "replace")
            self.tail.append(line)
            sys.stderr.write(line)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exitcode(self) -> int | None:
        return self.popen.poll()

    def last_lines(self) -> list[str]:
        """Its last lines of output, once it has exited: what it wrote last may still be in the pipe."""
        self._reader.join(HTTP_TIMEOUT_S)
        return list(self.tail)

    def stop(self) -> None:
        """SIGTERM to its process group (its engine core too), SIGKILL after ``STOP_WAIT_S``."""
        for sig, wait_s in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, STOP_WAIT_S)):
            if self.popen.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(wait_s)
        with contextlib.suppress(ProcessLookupError):  # what is left of its group (an engine core)
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.guard.kill()
        self.guard.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` on vLLM's loopback port: (status, body); (0, '') when it does not answer."""
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=HTTP_TIMEOUT_S)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return 0, ""
    finally:
        connection.close()


class VllmEngine:
    """The worker's inference side on vLLM: its load, its watch, its end."""

    def __init__(self, config: ServerConfig, view: WorkerView) -> None:
        self.config = config
        self.view = view
        self.state_machine = StateMachine(on_change=self._on_state, store=view.state_store())
        self.port = free_port()
        self.vllm: VllmProcess | None = None
        self._model_dir: Path | None = None
        self._load_error: str | None = None
        self._started = time.monotonic()
        self._last_busy = time.monotonic()
        self._drain_deadline: float | None = None

    def _on_state(self, old: State, new: State) -> None:
        log.info("worker state %s -> %s", old, new)

    # ---- the loop -------------------------------------------------------------------------------------

    def run(self, control: Connection) -> int:
        """Until the worker drains, fails or is stopped; returns the exit code."""
        self.state_machine.try_to(State.LOADING)
        threading.Thread(target=self._resolve, daemon=True, name="resolve").start()
        try:
            while True:
                if wait([control], POLL_S):
                    code = self._on_control(control)
                    if code is not None:
                        return code
                code = self._step(time.monotonic())
                if code is not None:
                    return code
        finally:
            if self.vllm is not None:
                self.vllm.stop()

    def _resolve(self) -> None:
        """The model's local directory (an hf:// source downloaded first), off the loop."""
        config = self.config
        try:
            self._model_dir = resolve(config.model, hf_home=config.hf_home, pvc_root=config.pvc_root)
        except Exception as exc:
            self._load_error = f"{type(exc).__name__}: {exc}"

    def _on_control(self, control: Connection) -> int | None:
        try:
            message = control.recv()
        except (EOFError, OSError):  # the supervisor is gone
            message = "stop"
        if message == "stop":
            return 0
        if message == "drain" and self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.config.drain_timeout
            self.state_machine.try_to(State.EVICTING, "SIGTERM")
        return None

    def _step(self, now: float) -> int | None:
        """One look at vLLM: its exit, its load, its work, the drain."""
        if self._load_error is not None:
            return self._fail(EXIT_LOAD_FAILED, f"cannot load the model: {self._load_error}")
        if self.vllm is None:
            if self._drain_deadline is not None:
                return self._drained()  # SIGTERM while it loaded: nothing was admitted
            if self._model_dir is not None:
                self._launch(self._model_dir)
            return None
        exitcode = self.vllm.exitcode()
        if exitcode is not None:
            loading = self.state_machine.state is State.LOADING
            reason = failure_reason(exitcode, self.vllm.last_lines(), loading)
            return self._fail(EXIT_LOAD_FAILED if loading else EXIT_DEVICE_FAILED, reason)
        if self.state_machine.state is State.LOADING:
            return self._check_health()
        return self._watch(now)

    def _launch(self, model_dir: Path) -> None:
        command = vllm_command(self.config, model_dir, self.port)
        log.info("starting vLLM: %s", shlex.join(command))
        self.vllm = VllmProcess(command, vllm_environment(os.environ, self.config))
        self.view.set(Field.LOAD_PROGRESS, 0.5)

    def _check_health(self) -> int | None:
        """Loading until vLLM's /health answers; then Ready, with its figures published first."""
        if self._drain_deadline is not None:
            return self._drained()  # SIGTERM while it loaded: nothing was admitted
        status, _ = _get(self.port, "/health")
        if status != 200:
            return None
        view = self.view
        view.set(Field.UPSTREAM_PORT, self.port)
        view.set(Field.LOAD_PROGRESS, 1.0)
        view.set(Field.LOAD_SECONDS, time.monotonic() - self._started)
        view.set(Field.TASK_IMPORTED, 1.0)
        view.set(Field.GENERATION_ENGINE, ENGINE_CODES[VLLM])
        self._publish(self._scrape())
        self.state_machine.try_to(State.READY, "vLLM is healthy")
        return None

    def _scrape(self) -> VllmLoad:
        status, text = _get(self.port, "/metrics")
        return parse_metrics(text) if status == 200 else VllmLoad()

    def _watch(self, now: float) -> int | None:
        """vLLM's work into the view and the state; the drain's end."""
        load = self._scrape()
        self._publish(load)
        busy = bool(load.running or load.waiting or self.view.door.taken)
        if busy:
            self._last_busy = now
        if self._drain_deadline is not None:
            return self._drain_step(busy, now)
        state = self.state_machine.state
        quiet = min(now - self._last_busy, time.time() - self.state_machine.since)
        target = next_state(state, busy, quiet, self.config.idle_after)
        if target is not None:
            self.state_machine.try_to(target)
        return None

    def _publish(self, load: VllmLoad) -> None:
        view = self.view
        taken = view.door.taken
        view.set(Field.IN_FLIGHT, load.running)
        view.set(Field.GENERATING, load.running)
        view.set(Field.BACKLOG_ITEMS, load.running + load.waiting)
        # Ours in the door that vLLM does not run yet: its own queue and those on their way to it.
        view.set(Field.QUEUED, max(0.0, taken - load.running))
        if load.seconds_per_request is not None:
            view.set(Field.SECONDS_PER_ITEM, load.seconds_per_request / max(1.0, load.running))
        tokens = load.kv_tokens
        view.set(Field.KV_CACHE_TOKENS, math.nan if tokens is None else tokens)
        view.set(Field.KV_CACHE_RESERVED, 0.0 if tokens is None else load.kv_usage * tokens)
        if self.vllm is not None:
            view.set(Field.ENGINE_RSS, tree_rss(self.vllm.pid))

    def _drain_step(self, busy: bool, now: float) -> int | None:
        """Evicting: done once nothing is in the door or in vLLM; exit 6 at the deadline."""
        assert self._drain_deadline is not None
        if not busy:
            return self._drained()
        if now < self._drain_deadline:
            return None
        abandoned = max(self.view.door.taken, int(self.view.get(Field.IN_FLIGHT)))
        reason = f"drain timed out after {self.config.drain_timeout:g} s: {abandoned} requests abandoned"
        log.error("%s", reason)
        self.state_machine.try_to(State.DEAD, reason)
        return EXIT_DRAIN_TIMED_OUT

    def _drained(self) -> int:
        log.info("drain complete")
        self.state_machine.try_to(State.DEAD, "drained")
        return 0

    def _fail(self, code: int, reason: str) -> int:
        """Failed with ``reason`` (the supervisor writes it to the termination log and exits ``code``)."""
        log.error("%s", reason)
        if code == EXIT_LOAD_FAILED:
            self.view.set(Field.LOAD_FAILED, 1.0)
        self.state_machine.try_to(State.FAILED, reason)
        return code


def main(
    config: ServerConfig,
    view: WorkerView,
    sockets: list[socket.socket],
    control: Connection,
    metrics_model: str | None = None,
) -> None:
    """The process's entry point (the supervisor's spawn target, as ``inference_process.main``).  The
    HTTP processes' channels are held open and unused: they relay to vLLM over HTTP."""
    set_up("inference", config)
    engine = VllmEngine(config, view)
    code = engine.run(control)
    for sock in sockets:
        sock.close()
    exit_now(code)


__all__ = [
    "VllmEngine",
    "VllmLoad",
    "failure_reason",
    "main",
    "next_state",
    "parse_metrics",
    "telling_lines",
    "vllm_command",
    "vllm_environment",
]
