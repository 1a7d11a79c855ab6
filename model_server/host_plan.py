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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
    "device_overhead",
    "device_used",
    "host_used",
    "make_room",
    "model_of",
    "sleep_refusal",
]
