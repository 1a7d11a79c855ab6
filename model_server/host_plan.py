"""A shared host's decisions, as pure functions (issue 21): the host's supervisor and its HTTP processes
call these with what they read from the models' shared views; no I/O, no processes, no clock.

* ``model_of``: which model a request is for (the v2 path's ``{name}``, the OpenAI body's ``model``).
* ``device_used``/``device_overhead``/``host_used``: a device's ledger (awake models charged their device
  bytes: measured when known, else declared; every model loaded there, awake or asleep, its process's
  overhead: ``--model-overhead``, its CUDA context on a GPU, its RAM on a CPU) and the host memory that
  sleeping models' parked weights hold.
* ``make_room``: which idle models to put to sleep so that ``need`` bytes fit on a device (a new model's
  need is its size and its overhead; a sleep gives back the weights, not the overhead): least recently
  used first, never a Loading, Processing or Waking model nor one with work in hand; None when even
  that is not enough (or host memory cannot take their weights).
* ``sleep_refusal``: why a model may not sleep now ('' when it may): not Ready/Idle, work in hand, or
  host memory short (the operator then unloads the least recently used sleeping model).
* ``visible_gpus``/``device_names``: the host's devices (``--gpus N``, else the GPUs the pod sees; a CPU
  host has one, the CPU) and the ``--device`` each one's models run with: ``cuda:<i>`` for index ``i`` of
  a host of several GPUs, the host's own ``--device`` for a host of one (unchanged: ``auto``, ``cpu``).
* ``device_refusal``/``roomiest_device``: whether a load may go on the device index its body names (the
  operator's choice), and the one a load that names none goes to (the most free, the lowest index first).
* ``device_report``: one device's entry of ``/stats`` ``host.devices[]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from model_server.state_machine import SLEEPABLE, State
from modelpool_contract.states import CHARGED_STATES, DEVICE_CHARGED_STATES

V2_MODELS = "/v2/models/"


@dataclass(frozen=True)
class SlotFacts:
    """What the host knows of one model for its decisions."""

    name: str
    state: State
    device: int  # index of the device it lives on
    device_bytes: int  # charged on the device while awake (measured reserved bytes when known, else declared)
    host_bytes: int  # charged in host memory while it sleeps (its parked weights)
    last_used: float  # when its last request came (least recently used sleeps first)
    busy: bool = False  # anything queued, in flight or on its way
    overhead: int = 0  # charged on the device while its process is there, awake or asleep (--model-overhead)


def device_used(device: int, slots: Iterable[SlotFacts]) -> int:
    """Bytes the ledger charges on ``device``: every model there that holds device memory."""
    return sum(s.device_bytes for s in slots if s.device == device and s.state.value in DEVICE_CHARGED_STATES)


def device_overhead(device: int, slots: Iterable[SlotFacts]) -> int:
    """Bytes the ledger charges on ``device`` for the models' processes: every model there, awake or
    asleep (a sleeping model's process keeps its CUDA context), none that failed or ended."""
    return sum(s.overhead for s in slots if s.device == device and s.state.value in CHARGED_STATES)


def device_free(device: int, capacity: int, slots: Sequence[SlotFacts]) -> int:
    """``capacity`` less what the ledger charges on ``device``: awake weights and every process's overhead."""
    return capacity - device_used(device, slots) - device_overhead(device, slots)


def host_used(slots: Iterable[SlotFacts]) -> int:
    """Host memory held by sleeping models' parked weights."""
    return sum(s.host_bytes for s in slots if s.state is State.SLEEPING)


def make_room(
    need: int, device: int, capacity: int, host_capacity: int | None, slots: Sequence[SlotFacts]
) -> list[str] | None:
    """The models to put to sleep, in order, so that ``need`` more bytes fit on ``device`` ([] when they
    fit already); None when sleeping every candidate would not be enough, or host memory (``None``:
    unbounded) could not hold their weights."""
    free = device_free(device, capacity, slots)
    if free >= need:
        return []
    host_free = None if host_capacity is None else host_capacity - host_used(slots)
    candidates = sorted(
        (s for s in slots if s.device == device and s.state in SLEEPABLE and not s.busy),
        key=lambda s: (s.last_used, s.name),
    )
    chosen: list[str] = []
    for slot in candidates:
        if free >= need:
            break
        if host_free is not None:
            if slot.host_bytes > host_free:
                continue  # its weights would not fit in host memory: try a smaller one
            host_free -= slot.host_bytes
        chosen.append(slot.name)
        free += slot.device_bytes
    return chosen if free >= need else None


def sleep_refusal(slot: SlotFacts, host_capacity: int | None, slots: Iterable[SlotFacts]) -> str:
    """Why ``slot`` may not sleep now ('' when it may)."""
    if slot.state not in SLEEPABLE:
        return f"a {slot.state} model cannot sleep"
    if slot.busy:
        return "the model has work in hand"
    if host_capacity is not None and host_used(slots) + slot.host_bytes > host_capacity:
        return (
            f"host memory short: {slot.host_bytes} bytes to park, "
            f"{max(0, host_capacity - host_used(slots))} free of {host_capacity}"
        )
    return ""


def visible_gpus(cuda_visible_devices: str | None, dev_entries: Iterable[str]) -> int:
    """The GPUs this process sees: those ``CUDA_VISIBLE_DEVICES`` lists when it is set, else the NVIDIA
    device files (``/dev/nvidia<N>``: in a container, the device plugin mounts only the GPUs the pod was
    given). 0: none."""
    if cuda_visible_devices is not None:
        listed = [d.strip() for d in cuda_visible_devices.split(",")]
        # CUDA stops at the first entry that is not a device ("-1", "" or "none": no GPU at all).
        count = 0
        for entry in listed:
            if not entry or entry.startswith("-") or entry.lower() in ("none", "void"):
                break
            count += 1
        return count
    return sum(1 for name in dev_entries if re.fullmatch(r"nvidia\d+", name))


def device_names(device: str, count: int) -> tuple[str, ...]:
    """The ``--device`` of the models on each of the host's devices, by index: a host of one device (a CPU
    host, one GPU, ``--device cuda:N``) runs every model with its own ``--device``; one of ``count`` > 1
    GPUs runs the models of index ``i`` on ``cuda:<i>`` (the ``i``-th GPU the pod sees, in CUDA's order)."""
    if count <= 1 or device == "cpu" or device.startswith("cuda:"):
        return (device,)
    return tuple(f"cuda:{i}" for i in range(count))


def device_refusal(index: object, count: int) -> str:
    """Why a load may not go on device ``index`` of a host of ``count`` devices ('' when it may)."""
    if isinstance(index, bool) or not isinstance(index, int):
        return f"must be a device index (an integer), not {index!r}"
    if not 0 <= index < count:
        have = "device 0" if count == 1 else f"devices 0-{count - 1}"
        return f"device {index} is not one of this host's ({have})"
    return ""


def roomiest_device(count: int, capacity: int, slots: Sequence[SlotFacts]) -> int:
    """The device with the most free memory by the ledger (the lowest index among equals): where a load
    that names no device goes."""
    return max(range(count), key=lambda i: (device_free(i, capacity, slots), -i))


def device_report(
    index: int, name: str, capacity: int, model_overhead: int, slots: Sequence[SlotFacts]
) -> dict[str, Any]:
    """Device ``index``'s entry of the host's ``/stats`` ``host.devices[]`` (bytes): its capacity, what its
    awake models are charged, what its sleeping models park in host memory, what its models' processes
    hold, and what is free."""
    here = [s for s in slots if s.device == index]
    return {
        "index": index,
        "device": name,
        "capacity": capacity,
        "awake": device_used(index, here),
        "asleep": host_used(here),
        "overhead": device_overhead(index, here),
        "model_overhead": model_overhead,
        "free": device_free(index, capacity, here),
        "models": sorted(s.name for s in here if s.name),
    }


def model_of(path: str, body: bytes | None) -> str | None:
    """The model a request names: ``/v2/models/{name}/...`` or an OpenAI body's ``model`` (None: none)."""
    if path.startswith(V2_MODELS):
        name = path[len(V2_MODELS) :].split("/", 1)[0]
        return name or None
    if not body:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    model = document.get("model") if isinstance(document, dict) else None
    return model if isinstance(model, str) and model else None


__all__ = [
    "SlotFacts",
    "device_free",
    "device_names",
    "device_overhead",
    "device_refusal",
    "device_report",
    "device_used",
    "host_used",
    "make_room",
    "model_of",
    "roomiest_device",
    "sleep_refusal",
    "visible_gpus",
]
