"""Simulated shared GPU hosts for KWOK host pods (issue 21), and the auditor of every transition on them.

A ModelHost's pods on KWOK nodes run nothing: their pod IPs (loopback, hack/kwok/nodes.yaml) have no
server, so the operator could never place a model there.  ``HostSim`` follows a namespace's host pods
(label ``modelpool.dev/host``) and answers each one's probe port on its pod IP as
``modelpool-server --shared-host`` does: the real request handler and routes
(``model_server.supervisor.host_control.HostControlServer``: the control key check, the statuses and
error bodies), the real host's decisions (``model_server.host_plan``: which idle models it sleeps to
make room, why it refuses a sleep), the real state machine (``model_server.state_machine``: an illegal
transition raises) and the real ``/stats`` document (``modelpool_contract.stats.WorkerStats``).  Only the
model processes are simulated (``SimHost``): a load takes ``load_s`` (Loading, then Ready) and is charged
its declared bytes on the device (the host's charge: ``max(declared, measured)``, as
``HostSupervisor.Slot.facts``) and, awake or asleep, its process's overhead (the host pod's
``--model-overhead``, which the operator writes from ``ModelHost.spec.modelOverhead`` or the contract's
default: ``model_overhead``; ``/stats`` ``host.devices[]`` reports ``overhead``, ``model_overhead`` and
``free`` as the real host does), and reports ``measured_factor`` x declared as ``gpu_reserved_bytes`` while
awake, nothing while asleep (the weights left the device), as a GPU host does.  A host pod of
``--gpus N`` has N devices of ``--device-memory`` each (``SimHost.devices``): a load goes on the device its
body names (the operator's choice; else the roomiest, as the real host), makes room there only, and
``/stats`` reports each device and each model's device.  As a host pod started
with ``--sleep-idle`` (a ModelHost with ``hostMemory``), a model turns Idle after its pool's
``idleTimeoutSeconds`` (the load's ``idle_after``) without a request and then sleeps, unless the host
RAM is short (``host_plan.sleep_refusal``; asked again after ``RETRY_SLEEP_S``): ``SimHost.idle_tick``,
called at every poll of ``HostSim``.

The auditor (``Audit``) is told every transition under the host's lock, with the host's models as they
are then, and records a violation when a device's awake charges exceed its capacity, the parked weights
exceed the host RAM, a load is refused for room (the operator's ledger sent more than the device holds:
the real host answers 507), or a Loading/Processing/Waking model is unloaded or asked to sleep.  It keeps
every eviction (a model slept or unloaded while its pool still wants it) with the victim's and the next
newcomer's priority and last use, so a bench can check the operator's rule (``Eviction.wrong``): a sleep
may pass over priority (any idle model may sleep for a newcomer) but takes the lowest priority, then the
least recently used, of the idle models the host RAM could park; an unload is only ever of a lower
priority than the newcomer's.  ``HostSim.wrongly_short`` names the pools left short while a host could
have made their room by that rule.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from model_server import host_plan
from model_server.errors import ModelNotFound, SleepRefused
from model_server.host_config import parse_load_body
from model_server.state_machine import SLEEPABLE, State, StateMachine
from model_server.supervisor.host import RETRY_SLEEP_S, Conflict, HostSupervisor, NoRoom
from model_server.supervisor.host_control import HostControlServer
from modelpool_contract.flags import IDLE_AFTER_S
from modelpool_contract.placements import LABEL_HOST, default_model_overhead, device_charge
from modelpool_contract.stats import (
    HostDeviceStats,
    HostModelStats,
    HostReport,
    HostStats,
    StatsMemory,
    StatsModel,
)

#: A model Ready, or used, for less than this may still be loading or busy in the operator's view (its
#: /stats is as old as a scrape interval, and its pass waits for the resync), or too lately used to be put
#: to sleep (the operator's ``placement.decide.MIN_IDLE_S``, 10 s): not a candidate it passed over.
FRESH_S = 15.0
#: Never unloaded nor slept by the operator (the ledger's PROTECTED_STATES, the host's rule).
PROTECTED = frozenset({State.LOADING, State.PROCESSING, State.WAKING})


@dataclass
class SimModel:
    """One model on a simulated host (the real host's ``Slot``, without a process)."""

    name: str
    declared: int
    measured: int
    source: str
    task: str
    last_used: float = 0.0
    busy: bool = False
    overhead: int = 0  # its process's charge on the device, awake or asleep (the host's --model-overhead)
    idle_after: float = IDLE_AFTER_S  # Ready -> Idle after this quiet (its load's idle_after)
    retry_sleep_at: float = 0.0  # --sleep-idle: not asked to sleep again before this after a refusal
    state_machine: StateMachine = field(default_factory=StateMachine)
    device: int = 0  # the index of the host's device it lives on

    @property
    def state(self) -> State:
        return self.state_machine.state

    def facts(self) -> host_plan.SlotFacts:
        """As ``HostSupervisor.Slot.facts``: charged the larger of declared and measured, parked the same,
        and its process's overhead awake or asleep."""
        charged = device_charge(self.declared, self.measured)
        return host_plan.SlotFacts(
            self.name, self.state, self.device, charged, charged, self.last_used, self.busy, self.overhead
        )

    def stats(self) -> HostModelStats:
        awake = self.state.value not in ("Sleeping", "Dead", "Failed")
        return HostModelStats(
            state=self.state.value,
            state_since=self.state_machine.since,
            reason=self.state_machine.reason or None,
            queue_depth=0,
            in_flight=1 if self.busy else 0,
            last_request_time=self.last_used or None,
            memory=StatsMemory(gpu_reserved_bytes=self.measured if awake else 0),
            model=StatsModel(name=self.name, task=self.task, source=self.source),
            time=time.time(),
            device=self.device,
        )


@dataclass(frozen=True)
class Eviction:
    """A model put to sleep or unloaded on ``pod``, and the load that followed it there (``newcomer``)."""

    at: float
    pod: str
    action: str
    victim: str
    victim_priority: int
    victim_last_used: float
    # The other models the host could have chosen (sleepable then): (name, priority, last use).
    candidates: tuple[tuple[str, int, float], ...]
    newcomer: str | None = None
    newcomer_priority: int | None = None

    def wrong(self, also_evicted: frozenset[str] = frozenset()) -> str:
        """Why this victim was the wrong one ('' when the rule chose it: only a lower priority than the
        newcomer's is unloaded; a sleep, of any priority, takes the lowest priority then the least recently
        used); ``also_evicted``: the other victims of the same room (made for the same newcomer), which are
        no better candidates."""
        lower = self.newcomer_priority is None or self.victim_priority < self.newcomer_priority
        if self.action == "unload" and not lower:
            return (
                f"{self.victim} (priority {self.victim_priority}) unloaded for {self.newcomer} (priority "
                f"{self.newcomer_priority}): only a lower priority is unloaded"
            )
        better = [
            name
            for name, priority, used in self.candidates
            if (priority, used) < (self.victim_priority, self.victim_last_used) and name not in also_evicted
        ]
        if self.action == "sleep" and better:
            return f"{self.victim} slept while {', '.join(sorted(better))} came before it (priority, LRU)"
        return ""


class Audit:
    """Every transition on every simulated host, checked as it happens (thread-safe)."""

    def __init__(
        self,
        priority_of: Callable[[str], int] = lambda _: 0,
        replicas_of: Callable[[str], int] | None = None,
        declared_of: Callable[[str], int | None] | None = None,
    ) -> None:
        self.priority_of, self.replicas_of = priority_of, replicas_of
        # Each pool's declared bytes now (None: unknown): a model loaded with other bytes is unloaded for
        # its pool's changed settings (then loaded again), not evicted.
        self.declared_of = declared_of
        self.holders: dict[str, set[str]] = {}  # model -> the host pods holding it
        self.lock = threading.Lock()
        self.transitions = 0
        self.violations: list[str] = []
        self.evictions: list[Eviction] = []
        self.host_made_room = 0  # loads for which the host itself slept idle models (the operator did not)
        self.calls: dict[str, int] = {}
        self.last_call = time.monotonic()

    def call(self, action: str) -> None:
        with self.lock:
            self.calls[action] = self.calls.get(action, 0) + 1
            self.last_call = time.monotonic()

    def violation(self, pod: str, what: str) -> None:
        with self.lock:
            self.violations.append(f"{time.strftime('%H:%M:%S')} {pod}: {what}")

    def check(self, host: SimHost, what: str) -> None:
        """After a transition on ``host`` (its lock held): each device and the host RAM within capacity."""
        facts = [m.facts() for m in host.models.values()]
        parked = host_plan.host_used(facts)
        with self.lock:
            self.transitions += 1
        for device in range(host.devices):
            # The awake weights and every loaded model's process overhead (host_plan.device_free's ledger).
            used = host.device_memory - host_plan.device_free(device, host.device_memory, facts)
            if used > host.device_memory:
                self.violation(
                    host.pod, f"device {device} over-committed after {what}: {used} > {host.device_memory}"
                )
        if parked > host.host_memory:
            self.violation(
                host.pod, f"host memory over-committed after {what}: {parked} > {host.host_memory}"
            )

    def evicted(self, host: SimHost, action: str, model: SimModel) -> None:
        """``model`` slept or unloaded on ``host``: an eviction unless its pool is gone or holds more host
        pods than its replicas (then the unload is the pool's own)."""
        with self.lock:
            holders = len(self.holders.get(model.name, ()))
        if self.replicas_of is not None and not 0 < holders <= self.replicas_of(model.name):
            return
        declared = self.declared_of(model.name) if self.declared_of is not None else None
        if action == "unload" and declared is not None and declared != model.declared:
            return
        # The other candidates: idle models the operator could have seen idle for long enough (its /stats
        # is one scrape old: a model Ready or used for less than ``FRESH_S`` was not a candidate in its
        # view) and that the host RAM could park.
        now = time.time()
        facts = host._facts()
        ram_free = host.host_memory - host_plan.host_used(facts)
        candidates = tuple(
            (m.name, self.priority_of(m.name), m.last_used)
            for m in host.models.values()
            if m is not model
            and m.device == model.device  # room is made on one device: the others' models are no candidates
            and m.state in SLEEPABLE
            and not m.busy
            and now - idle_since(m) >= FRESH_S
            and m.facts().host_bytes <= ram_free
        )
        with self.lock:
            self.evictions.append(
                Eviction(
                    time.time(), host.pod, action, model.name, self.priority_of(model.name), model.last_used,
                    candidates,
                )
            )  # fmt: skip

    def loaded(self, pod: str, name: str) -> None:
        """A load on ``pod``: the newcomer of the evictions there that have none yet or one of a lower
        priority (a pass's loads run at once, in any order: the room was made for the highest of them); a
        pool loaded on more host pods than its replicas is a thrash (the surplus is unloaded next)."""
        with self.lock:
            holders = self.holders.setdefault(name, set())
            holders.add(pod)
            wanted = self.replicas_of(name) if self.replicas_of is not None else None
        if wanted is not None and len(holders) > wanted:
            self.violation(pod, f"{name} loaded on {sorted(holders)}: more than its {wanted} replicas")
        with self.lock:
            for i, e in enumerate(self.evictions):
                later = e.newcomer is None or self.priority_of(name) > (e.newcomer_priority or 0)
                if e.pod == pod and later and time.time() - e.at < 5:
                    self.evictions[i] = Eviction(
                        e.at, e.pod, e.action, e.victim, e.victim_priority, e.victim_last_used,
                        e.candidates, name, self.priority_of(name),
                    )  # fmt: skip

    def released(self, pod: str, name: str) -> None:
        with self.lock:
            self.holders.get(name, set()).discard(pod)

    def wrong_evictions(self) -> list[str]:
        with self.lock:
            evictions = list(self.evictions)
        rooms: dict[tuple[str, str | None], set[str]] = {}
        for e in evictions:
            rooms.setdefault((e.pod, e.newcomer), set()).add(e.victim)
        return [
            w
            for e in evictions
            if e.newcomer is not None and (w := e.wrong(frozenset(rooms[(e.pod, e.newcomer)])))
        ]

    def quiet_for(self) -> float:
        return time.monotonic() - self.last_call


@dataclass(frozen=True)
class SimConfig:
    """What ``HostControlServer`` reads of a host's configuration."""

    control_key: str | None


class SimHost:
    """One simulated host pod: the duck type of ``HostSupervisor`` that ``host_control.control`` calls."""

    def __init__(
        self,
        pod: str,
        *,
        device_memory: int,
        host_memory: int,
        key: str | None,
        audit: Audit,
        load_s: float = 1.0,
        measured_factor: float = 1.0,
        overhead: int = 0,
        devices: int = 1,
        sleep_idle: bool = False,
    ) -> None:
        self.pod, self.device_memory, self.host_memory = pod, device_memory, host_memory
        self.devices = devices  # each of device_memory (the host pod's --gpus; 1: a CPU or one-GPU host)
        self.sleep_idle = sleep_idle  # --sleep-idle: an Idle model sleeps (idle_tick)
        self.overhead = overhead  # each model's process on the device, awake or asleep (--model-overhead)
        self.config = SimConfig(key)
        self.audit, self.load_s, self.measured_factor = audit, load_s, measured_factor
        self.failed = False
        self.http: list[Any] = []  # no HTTP processes: ready while not failed
        self.lock = threading.RLock()
        self.models: dict[str, SimModel] = {}

    def _facts(self, keep: SimModel | None = None) -> list[host_plan.SlotFacts]:
        return [m.facts() for m in self.models.values() if m is not keep]

    def _to(self, model: SimModel, state: State, why: str) -> None:
        model.state_machine.to(state, why)
        self.audit.check(self, f"{model.name} -> {state.value}")

    def _make_room(self, need: int, keep: SimModel | None, device: int = 0) -> None:
        chosen = host_plan.make_room(need, device, self.device_memory, self.host_memory, self._facts(keep))
        if chosen is None:
            used = self.device_memory - host_plan.device_free(device, self.device_memory, self._facts(keep))
            self.audit.violation(
                self.pod, f"a load or wake of {need} bytes refused on device {device}: {used} in use"
            )
            raise NoRoom(
                f"{need} bytes do not fit on device {device} ({self.device_memory} bytes, {used} in use) "
                "even with every idle model asleep"
            )
        if chosen:
            with self.audit.lock:
                self.audit.host_made_room += 1
        for name in chosen:
            self._sleep(self.models[name], evicting=False)

    def load(self, name: str, body: bytes) -> SimModel:
        self.audit.call("load")
        settings, declared, device = parse_load_body(body, self.devices)
        with self.lock:
            if name in self.models:
                raise Conflict(f"model {name!r} is loaded already")
            device = self._device(device)
            # Its process holds the overhead on the device from its start, asleep or awake (the host's rule).
            self._make_room(declared + self.overhead, keep=None, device=device)
            model = SimModel(
                name,
                declared,
                int(declared * self.measured_factor),
                str(settings.get("model") or ""),
                str(settings.get("task") or ""),
                overhead=self.overhead,
                device=device,
                idle_after=float(settings.get("idle_after") or IDLE_AFTER_S),
            )
            self.models[name] = model
            self._to(model, State.LOADING, "loading")
            self.audit.loaded(self.pod, name)
        time.sleep(self.load_s)
        with self.lock:
            if self.models.get(name) is model and model.state is State.LOADING:
                self._to(model, State.READY, "")
        return model

    def unload(self, name: str) -> None:
        self.audit.call("unload")
        with self.lock:
            model = self.slot_of(name)
            if model.state in PROTECTED or model.busy:
                self.audit.violation(self.pod, f"{name} unloaded while {model.state.value}")
            if model.state in SLEEPABLE | {State.SLEEPING}:
                self.audit.evicted(self, "unload", model)
            if model.state is not State.FAILED:
                # Checked once gone: a sleeping model passes through Evicting, which the host's ledger
                # charges on the device for that instant, though its weights are in host RAM.
                model.state_machine.to(State.EVICTING, "unloaded")
                model.state_machine.to(State.DEAD, "unloaded")
            del self.models[name]
            self.audit.released(self.pod, name)
            self.audit.check(self, f"{name} unloaded")

    def sleep(self, name: str) -> SimModel:
        self.audit.call("sleep")
        with self.lock:
            model = self.slot_of(name)
            self._sleep(model, evicting=True)
        return model

    def _sleep(self, model: SimModel, *, evicting: bool) -> None:
        refusal = host_plan.sleep_refusal(model.facts(), self.host_memory, self._facts())
        if refusal:
            if model.state in PROTECTED:
                self.audit.violation(self.pod, f"{model.name} asked to sleep while {model.state.value}")
            raise SleepRefused(refusal)
        if evicting:
            self.audit.evicted(self, "sleep", model)
        self._to(model, State.SLEEPING, "asked to sleep")

    def wake(self, name: str) -> SimModel:
        self.audit.call("wake")
        with self.lock:
            model = self.slot_of(name)
            if model.state is State.SLEEPING:
                # ``keep`` leaves it out of the ledger: its overhead, held asleep too, is asked back.
                self._make_room(model.facts().device_bytes + model.overhead, keep=model, device=model.device)
                self._to(model, State.WAKING, "asked to wake")
                self._to(model, State.READY, "")
        return model

    def _device(self, named: int | None) -> int:
        """The device a load goes on: the one its body names, else the roomiest (as the real host)."""
        if named is not None:
            return named
        return host_plan.roomiest_device(self.devices, self.device_memory, self._facts())

    def touch(self, name: str, at: float | None = None) -> None:
        """A request served (the model's last use), as traffic would leave it."""
        with self.lock:
            if (model := self.models.get(name)) is not None:
                model.last_used = at if at is not None else time.time()
                self._served(model)

    def _served(self, model: SimModel) -> None:
        """An Idle model that served a request is Ready again (Idle -> Processing -> Ready, as the
        dataplane moves it), its idle time counted afresh."""
        if model.state is State.IDLE:
            self._to(model, State.PROCESSING, "")
            self._to(model, State.READY, "")

    def idle_tick(self, now: float | None = None) -> list[str]:
        """The host's idle rule at ``now``: a Ready model quiet for its ``idle_after`` turns Idle (the
        dataplane's ``watch_idle``: ``turns_idle``); with ``--sleep-idle`` an Idle one then sleeps unless
        ``host_plan.sleep_refusal`` says why not (asked again after ``RETRY_SLEEP_S``), as
        ``HostSupervisor._sleep_idle`` does. The host's own sleeps are no evictions. Returns those slept."""
        now = time.time() if now is None else now
        slept = []
        with self.lock:
            for model in list(self.models.values()):
                if model.state is State.READY and turns_idle(model, now):
                    self._to(model, State.IDLE, "idle")
                if model.state is State.IDLE and self.sleep_idle and now >= model.retry_sleep_at:
                    if host_plan.sleep_refusal(model.facts(), self.host_memory, self._facts()):
                        model.retry_sleep_at = now + RETRY_SLEEP_S
                        continue
                    self._to(model, State.SLEEPING, "idle")
                    slept.append(model.name)
        return slept

    def slot_of(self, name: str) -> SimModel:
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(f"model {name!r} is not loaded on this host")
        return model

    def stall(self, now: float) -> str:
        """No HTTP processes, so none stalls (``HostSupervisor.stall``)."""
        return ""

    def index(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {"name": m.name, "state": m.state.value, "reason": m.state_machine.reason, "device": m.device,
                 "bytes": m.facts().device_bytes, "pid": 0}
                for m in self.models.values()
            ]  # fmt: skip

    def stats(self) -> dict[str, Any]:
        with self.lock:
            facts = self._facts()
            devices = [  # as HostSupervisor.stats
                host_plan.device_report(i, f"cuda:{i}", self.device_memory, self.overhead, facts)
                for i in range(self.devices)
            ]
            models = {m.name: m.stats() for m in self.models.values()}
        return HostStats(
            host=HostReport(devices=[HostDeviceStats(**d) for d in devices]), models=models
        ).wire()

    def states(self) -> dict[str, str]:
        with self.lock:
            return {m.name: m.state.value for m in self.models.values()}


def gpus(args: list[str]) -> int:
    """The devices of a host pod, read as the host reads its flags: ``--gpus`` (the operator writes the
    ModelHost's ``gpusPerHost`` there), else one (a CPU host, or the one GPU)."""
    return int(args[args.index("--gpus") + 1]) if "--gpus" in args else 1


def model_overhead(args: list[str]) -> int:
    """What a host pod's models' processes each cost on its device, read as the host reads its flags:
    ``--model-overhead`` (the operator writes ``ModelHost.spec.model_overhead_bytes`` there), else the
    host's default (``HostConfig.overhead``: the contract's, a CPU's unless ``--device`` may be a GPU)."""
    if "--model-overhead" in args:
        return int(args[args.index("--model-overhead") + 1])
    device = args[args.index("--device") + 1] if "--device" in args else "auto"
    return default_model_overhead(gpu=device != "cpu")


def idle_since(model: SimModel) -> float:
    """Since when the model has had nothing to do, as the operator's ledger counts it
    (``placement.ledger.Resident.idle_since``): its last request, or its entering Ready if later."""
    if model.state is State.IDLE:
        return model.last_used
    return max(model.last_used, model.state_machine.since)


def turns_idle(model: SimModel, now: float) -> bool:
    """Ready -> Idle (``engine.dataplane.watch_idle``): nothing in hand and quiet for ``idle_after``, the
    quiet counted from the later of its last request and its entering Ready."""
    quiet = min(now - model.last_used, now - model.state_machine.since)
    return model.state is State.READY and not model.busy and quiet >= model.idle_after


class HostSim:
    """The simulated hosts of one namespace's host pods, each on its pod IP and ``probe_port``."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        probe_port: int,
        *,
        audit: Audit,
        load_s: float = 1.0,
        measured_factor: float = 1.0,
        poll_s: float = 0.5,
    ) -> None:
        self.kubeconfig, self.namespace, self.probe_port = kubeconfig, namespace, probe_port
        self.audit, self.load_s, self.measured_factor, self.poll_s = audit, load_s, measured_factor, poll_s
        self.hosts: dict[str, SimHost] = {}
        self._servers: dict[str, HostControlServer] = {}
        self._uids: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="hostsim", daemon=True)
        self.errors: list[str] = []

    def start(self) -> HostSim:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for pod in list(self._servers):
            self._drop(pod)

    def _kubectl(self, *args: str) -> dict[str, Any]:
        from testkit.kubectl import kubectl

        return cast(dict[str, Any], json.loads(kubectl(self.kubeconfig, *args, "-o", "json", timeout=30)))

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                pods = self._kubectl("get", "pods", "-n", self.namespace, "-l", LABEL_HOST)["items"]
                self.sync(pods)
                self.idle_tick()
            except Exception as exc:  # a slow API server: the next poll tries again
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    def sync(self, pods: list[Mapping[str, Any]]) -> None:
        """Serve the running host pods with an IP; a pod gone (or replaced) takes its models with it."""
        running = {}
        for pod in pods:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            if status.get("phase") == "Running" and status.get("podIP") and not meta.get("deletionTimestamp"):
                running[str(meta["name"])] = (str(meta.get("uid")), str(status["podIP"]), pod)
        for name in list(self._servers):
            if name not in running or running[name][0] != self._uids[name]:
                self._drop(name)
        for name, (uid, ip, pod) in running.items():
            if name not in self._servers:
                self._serve(name, uid, ip, pod)

    def _serve(self, name: str, uid: str, ip: str, pod: Mapping[str, Any]) -> None:
        args = list(((pod.get("spec") or {}).get("containers") or [{}])[0].get("args") or [])
        host = str(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_HOST) or "")
        secret = self._kubectl("get", "secret", f"{host}-control-key", "-n", self.namespace)
        key = base64.b64decode(secret["data"]["key"]).decode()
        sim = SimHost(
            name,
            device_memory=int(args[args.index("--device-memory") + 1]),
            host_memory=int(args[args.index("--host-memory") + 1]) if "--host-memory" in args else 0,
            key=key,
            audit=self.audit,
            load_s=self.load_s,
            measured_factor=self.measured_factor,
            overhead=model_overhead(args),
            devices=gpus(args),
            sleep_idle="--sleep-idle" in args,
        )
        # The real probe-port server, over the simulated host (it calls only what SimHost answers).
        server = HostControlServer((ip, self.probe_port), cast(HostSupervisor, sim))
        server.serve_in_thread()
        self.hosts[name], self._servers[name], self._uids[name] = sim, server, uid

    def _drop(self, name: str) -> None:
        server = self._servers.pop(name)
        server.shutdown()
        server.server_close()
        for model in (sim := self.hosts.pop(name)).models:
            self.audit.released(sim.pod, model)
        self._uids.pop(name, None)

    def placements(self) -> dict[str, dict[str, str]]:
        """Each pool's model by host pod: ``{model: {pod: state}}``."""
        found: dict[str, dict[str, str]] = {}
        for pod, sim in list(self.hosts.items()):
            for model, state in sim.states().items():
                found.setdefault(model, {})[pod] = state
        return found

    def touch(self, model: str) -> None:
        for sim in list(self.hosts.values()):
            sim.touch(model)

    def idle_tick(self) -> None:
        """Each host's idle rule (``SimHost.idle_tick``)."""
        for sim in list(self.hosts.values()):
            sim.idle_tick()

    def converged(self, wanted: Mapping[str, tuple[int, int, int]], quiet_s: float = 3.0) -> bool:
        """Settled: no control call for ``quiet_s``, no model loading, no model of a pool not in
        ``wanted`` (pool -> (replicas, declared bytes, priority)), no pool on more host pods than its
        replicas, and none on fewer while room could be made for it (``wrongly_short``)."""
        if not self.hosts or self.audit.quiet_for() < quiet_s:
            return False
        for pool, pods in self.placements().items():
            if pool not in wanted or len(pods) > wanted[pool][0] or "Loading" in pods.values():
                return False
        return not self.wrongly_short(wanted)

    def short(self, wanted: Mapping[str, tuple[int, int, int]]) -> dict[str, int]:
        """The pools held by fewer host pods than their replicas, and by how many."""
        placed = self.placements()
        return {
            pool: replicas - len(placed.get(pool, {}))
            for pool, (replicas, _, _) in wanted.items()
            if len(placed.get(pool, {})) < replicas
        }

    def wrongly_short(self, wanted: Mapping[str, tuple[int, int, int]]) -> list[str]:
        """The short pools for which some host pod not holding them has room by the operator's rule: its
        idle models of any priority asleep where its host RAM parks them (the lowest priority, then the
        least recently used, first), those of a lower priority that it cannot park unloaded, and then its
        sleeping models of a lower priority unloaded for their processes' overhead."""
        wrong = []
        for pool in self.short(wanted):
            _, declared, priority = wanted[pool]
            for pod, sim in list(self.hosts.items()):
                with sim.lock:
                    if pool in sim.models:
                        continue
                    need = declared + sim.overhead  # its weights and its process's overhead
                    fits = [d for d in range(sim.devices) if self._room_for(sim, d, need, priority)]
                if fits:
                    where = pod if sim.devices == 1 else f"{pod} device {fits[0]}"
                    wrong.append(f"{pool} ({declared} bytes, priority {priority}) fits on {where}")
        return wrong

    def _room_for(self, sim: SimHost, device: int, need: int, priority: int) -> bool:
        """``need`` bytes (a model's weights and its process's overhead) fit on ``device`` of ``sim`` once
        room is made there for a newcomer of ``priority`` (its lock held)."""
        facts = sim._facts()
        free = host_plan.device_free(device, sim.device_memory, facts)
        host_free = sim.host_memory - host_plan.host_used(facts)
        here = [f for f in facts if f.device == device]  # room is made on one device
        rank = {f.name: (self.audit.priority_of(f.name), f.last_used, f.name) for f in here}
        for f in sorted((f for f in here if f.state in SLEEPABLE and not f.busy), key=lambda f: rank[f.name]):
            if free >= need:
                return True
            if f.host_bytes <= host_free:
                free, host_free = free + f.device_bytes, host_free - f.host_bytes
            elif rank[f.name][0] < priority:
                free += f.device_bytes + f.overhead
        for f in sorted((f for f in here if f.state is State.SLEEPING), key=lambda f: rank[f.name]):
            if free >= need:
                return True
            if rank[f.name][0] < priority:
                free += f.overhead
        return free >= need


__all__ = [
    "Audit",
    "Eviction",
    "HostSim",
    "SimHost",
    "SimModel",
    "gpus",
    "idle_since",
    "model_overhead",
    "turns_idle",
]
