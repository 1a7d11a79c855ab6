"""Sleep and wake of one loaded model: its weights parked in host memory and back (vLLM's "sleep level 1").

``park`` moves every parameter and buffer of a task's torch modules out of the modules into a parked copy:
on CUDA a pinned host copy (so that the wake's host-to-device copies run at the bus's speed), after which
the modules hold empty tensors, the caching allocator gives its blocks back (``empty_cache``) and the
device memory the model held is returned; on a CPU the parked copy is the tensor itself (there is no
device memory to return: the model simply holds no weights while asleep).  ``unpark`` puts them back on
the device the model was on, and on CUDA empties torch's caching host allocator, which would otherwise
keep the pinned blocks of the parked copies (host memory held by an awake model).  A parameter shared by
several modules (tied embeddings) is one object and is parked once; a buffer shared between modules is
parked once and restored into each of them.

Only the inference thread calls these (it alone touches the model).  ``device_memory`` reads the CUDA
caching allocator's figures so that the caller can measure what a sleep returned.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class DeviceMemory(NamedTuple):
    """The CUDA caching allocator's bytes on one device (allocated, reserved); zeros on a CPU."""

    allocated: int
    reserved: int


NO_DEVICE_MEMORY = DeviceMemory(0, 0)


@dataclass
class Parked:
    """A model's weights while it sleeps: each parameter (by identity) and each module's buffer slot with
    its parked tensor, the device to wake it on, and what the sleep measured."""

    device: str
    params: list[tuple[Any, Any]] = field(default_factory=list)  # (Parameter, parked tensor)
    buffers: list[tuple[Any, str, int]] = field(default_factory=list)  # (module, name, key into tensors)
    tensors: dict[int, Any] = field(default_factory=dict)  # a buffer's parked tensor, by its identity
    bytes: int = 0  # the weights' bytes (what host memory holds while the model sleeps)
    before: DeviceMemory = NO_DEVICE_MEMORY  # the device's memory before the sleep
    after: DeviceMemory = NO_DEVICE_MEMORY  # and after it (empty_cache included)

    @property
    def freed(self) -> int:
        """Device bytes the sleep gave back (the allocator's reserved bytes, before - after)."""
        return max(0, self.before.reserved - self.after.reserved)


def modules_of(task: Any) -> list[Any]:
    """The torch modules a loaded task holds: its attributes that are modules, and the modules among a
    pipeline's ``components`` (diffusers), each once."""
    torch = sys.modules.get("torch")
    if torch is None:  # a handler without torch holds no weights to park
        return []
    found: dict[int, Any] = {}
    for value in vars(task).values():
        candidates = [value]
        components = getattr(value, "components", None)
        if isinstance(components, dict):
            candidates += list(components.values())
        for candidate in candidates:
            if isinstance(candidate, torch.nn.Module):
                found.setdefault(id(candidate), candidate)
    return list(found.values())


def device_memory(device: str) -> DeviceMemory:
    """The CUDA caching allocator's allocated and reserved bytes on ``device`` (zeros on a CPU)."""
    torch = sys.modules.get("torch")
    if torch is None or not device.startswith("cuda") or not torch.cuda.is_available():
        return NO_DEVICE_MEMORY
    index = torch.device(device)
    return DeviceMemory(int(torch.cuda.memory_allocated(index)), int(torch.cuda.memory_reserved(index)))


def park(modules: list[Any], device: str) -> Parked:
    """Move the modules' weights to host memory (pinned on CUDA) and leave empty tensors in their place;
    on CUDA, give the freed blocks back to the device and measure what was returned."""
    import torch

    cuda = device.startswith("cuda")
    parked = Parked(device=device, before=device_memory(device))

    def host_copy(tensor: Any) -> Any:
        if not cuda:
            return tensor  # already in host memory: the module lets go of it, nothing is copied
        copy = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
        copy.copy_(tensor)
        return copy

    try:
        _park_into(parked, modules, host_copy)
    except BaseException:  # host memory short (a pinned allocation failed): put back what moved
        unpark(parked)
        raise
    if cuda:
        torch.cuda.synchronize(torch.device(device))
    _release(device)
    parked.after = device_memory(device)
    return parked


def _park_into(parked: Parked, modules: list[Any], host_copy: Callable[[Any], Any]) -> None:
    import torch

    seen: set[int] = set()
    with torch.no_grad():
        for module in modules:
            for sub in module.modules():
                for param in sub._parameters.values():
                    if param is None or id(param) in seen:
                        continue
                    seen.add(id(param))
                    parked.params.append((param, host_copy(param.data)))
                    parked.bytes += param.data.numel() * param.data.element_size()
                    param.data = torch.empty(0, dtype=param.dtype, device=param.device)
                for name, buffer in list(sub._buffers.items()):
                    if buffer is None:
                        continue
                    key = id(buffer)
                    if key not in parked.tensors:
                        parked.tensors[key] = host_copy(buffer)
                        parked.bytes += buffer.numel() * buffer.element_size()
                    parked.buffers.append((sub, name, key))
                    sub._buffers[name] = torch.empty(0, dtype=buffer.dtype, device=buffer.device)


def unpark(parked: Parked) -> None:
    """Copy the parked weights back onto the device and into their modules (the model is whole again),
    then give the pinned host memory the parked copies held back to the system."""
    _restore(parked)
    if parked.device.startswith("cuda"):
        _release_pinned()


def _restore(parked: Parked) -> None:
    import torch

    cuda = parked.device.startswith("cuda")
    restored: dict[int, Any] = {}
    with torch.no_grad():
        for param, host in parked.params:
            param.data = host.to(parked.device, non_blocking=True) if cuda else host
        for module, name, key in parked.buffers:
            if key not in restored:
                host = parked.tensors[key]
                restored[key] = host.to(parked.device, non_blocking=True) if cuda else host
            module._buffers[name] = restored[key]
    if cuda:
        torch.cuda.synchronize(torch.device(parked.device))
    parked.params.clear()
    parked.buffers.clear()
    parked.tensors.clear()


def held_bytes(modules: list[Any]) -> int:
    """Bytes of the parameters and buffers the modules hold now (0 for a model asleep)."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
    return total


def _release_pinned() -> None:
    """Empty torch's caching host allocator.  It keeps every freed pinned block for reuse, so without this
    an awake model's process would go on holding its weights' bytes of page-locked host memory after each
    wake (charged to the pod, never swapped, and not in the ledger, which charges host memory only while
    a model sleeps).  Called once the parked copies are dropped (their blocks are then free)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    gc.collect()
    accelerator = getattr(torch, "accelerator", None)
    empty = getattr(accelerator, "empty_host_cache", None) or getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:  # torch >= 2.5 (torch._C._host_emptyCache); older ones cannot release it
        empty()


def _release(device: str) -> None:
    """Drop what still refers to the freed tensors and give the allocator's cached blocks back."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and device.startswith("cuda"):
        torch.cuda.empty_cache()
