"""LoRA adapters per request on the transformers engine (``spec.adapters``, ``--adapter NAME=SOURCE``).

A request names an adapter in its ``model`` field (as vLLM and the OpenAI protocol do); the worker loads
it on its first request with peft (``inject_adapter_in_model`` and ``set_peft_model_state_dict`` into the
loaded model, in place: the base weights are shared) and keeps at most ``--max-adapters`` loaded, making
room by unloading the least recently used adapter no running request uses (``lru_evictions``; none idle:
429).  Loads run one at a time on a thread of their own, off the event loop.

Mixing: every forward pass of the model runs under ``AdapterBank``'s lock with an *assignment*, and a
pre-hook on every peft LoRA layer passes it to peft as ``adapter_names`` (peft's mixed-batch forward:
each sample its own adapter, ``__base__`` none).  Continuous batching packs every request of an
iteration into one sequence (``input_ids`` of shape [1, T], ``cu_seq_lens_q`` the requests' bounds), so
there a *token* is the sample: the hook hands peft the layer's input as [T, 1, ...] with one name per
token (``token_names``) and turns the output back, which is exact because a LoRA layer acts on each
token alone.  The serial path (``generate``, one request) assigns one adapter to the whole pass.  The
layers' own active adapters are cleared, so a pass with no assignment (the base alone) costs nothing more.

The loaded set is reported as a bit mask over the declared adapters (``adapter_mask``): one float of the
worker's shared view, from which ``/stats`` and the picker's ``vllm:lora_requests_info`` read names.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from model_server.adapter_mask import adapter_mask
from model_server.config import ServerConfig
from model_server.engine import sources
from model_server.errors import Overloaded

log = logging.getLogger("modelpool.adapters")

#: peft's name for "no adapter" in a mixed batch.
BASE = "__base__"
#: The key prefix of a PeftModel's saved weights, absent from a model the adapter is injected into.
SAVED_PREFIX = "base_model.model."
#: Retry-After of a request whose adapter finds every slot taken by running requests.
BUSY_RETRY_S = 1

Assignment = str | list[str] | None


# ---- pure decisions ---------------------------------------------------------------------------------


def lru_evictions(
    loaded: Sequence[str], in_use: Collection[str], want: str, capacity: int
) -> list[str] | None:
    """Pure: the adapters to unload, least recently used first (``loaded`` is oldest first), so that
    ``want`` fits within ``capacity``; None when too many of them are in use to make room."""
    if want in loaded:
        return []
    excess = len(loaded) + 1 - capacity
    if excess <= 0:
        return []
    idle = [name for name in loaded if name not in in_use]
    return idle[:excess] if len(idle) >= excess else None


def token_names(names: Sequence[str], bounds: Sequence[int], tokens: int) -> list[str]:
    """Pure: one adapter name per token of a packed batch: request ``i`` holds tokens ``bounds[i]`` to
    ``bounds[i+1]``; tokens past the last bound (padding) are the base's."""
    out: list[str] = []
    for name, start, end in zip(names, bounds, bounds[1:], strict=False):
        out.extend([name] * (end - start))
    return (out + [BASE] * tokens)[:tokens]


def strip_saved_prefix(weights: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: a saved PeftModel's keys as the injected model names them."""
    return {k[len(SAVED_PREFIX) :] if k.startswith(SAVED_PREFIX) else k: v for k, v in weights.items()}


# ---- the bank -----------------------------------------------------------------------------------------


class AdapterBank:
    """The adapters of one loaded model: which are loaded (LRU order), which running requests pin, and
    the forward pass's assignment (see the module docstring)."""

    def __init__(
        self, model: Any, sources: Mapping[str, str], capacity: int, resolve: Callable[[str], Path]
    ) -> None:
        self._model = model
        self.declared = list(sources)
        self._sources = dict(sources)
        self.capacity = capacity
        self._resolve = resolve
        self._loaded: OrderedDict[str, None] = OrderedDict()  # oldest first
        self._pins: Counter[str] = Counter()
        self._book = threading.Lock()  # the loaded set and the pins
        self._model_lock = threading.Lock()  # a forward pass, or a change of the model's layers
        self._hooked: set[int] = set()
        self._assignment: Assignment = None
        self._whole: str | None = None  # the serial path's adapter for its passes
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adapter-load")
        #: Set by the batching engine: the adapter of each request of the batch being computed.
        self.batch_names: Callable[[], list[str]] | None = None
        self._wrap_forward()

    # ---- figures --------------------------------------------------------------------------------------

    @property
    def loaded(self) -> list[str]:
        """The adapters in memory, least recently used first."""
        with self._book:
            return list(self._loaded)

    @property
    def running(self) -> list[str]:
        """The adapters running requests use."""
        with self._book:
            return sorted(name for name, count in self._pins.items() if count > 0)

    def mask(self) -> int:
        return adapter_mask(self.declared, self.loaded)

    # ---- pins ------------------------------------------------------------------------------------------

    def acquire(self, name: str) -> bool:
        """Pin ``name`` for a request when it is loaded (and make it the most recently used)."""
        with self._book:
            if name not in self._loaded:
                return False
            self._loaded.move_to_end(name)
            self._pins[name] += 1
            return True

    def release(self, name: str) -> None:
        with self._book:
            self._pins[name] -= 1
            if self._pins[name] <= 0:
                del self._pins[name]

    def ensure(self, name: str) -> None:
        """Load ``name`` if needed (making room) and pin it; blocking, on the loader's one thread."""
        self._loader.submit(self._ensure, name).result()

    async def ensure_async(self, name: str) -> None:
        """``ensure`` from an event loop, which goes on meanwhile."""
        import asyncio

        await asyncio.wrap_future(self._loader.submit(self._ensure, name))

    @contextmanager
    def applied(self, name: str | None) -> Iterator[None]:
        """The serial path: every forward pass inside applies ``name`` (None: the base) to the whole batch."""
        if name is None:
            yield
            return
        if not self.acquire(name):
            self.ensure(name)
        self._whole = name
        try:
            yield
        finally:
            self._whole = None
            self.release(name)

    def _ensure(self, name: str) -> None:
        if self.acquire(name):
            return
        with self._book:
            evict = lru_evictions(list(self._loaded), set(self._pins), name, self.capacity)
            if evict is None:
                raise Overloaded(
                    f"adapter {name!r} cannot be loaded now: all {self.capacity} adapter slots "
                    "(--max-adapters) are used by running requests",
                    BUSY_RETRY_S,
                )
            for old in evict:
                del self._loaded[old]
        for old in evict:
            self._unload(old)
        self._load(name)
        with self._book:
            self._loaded[name] = None
            self._pins[name] += 1

    # ---- peft -----------------------------------------------------------------------------------------

    def _load(self, name: str) -> None:
        from peft import PeftConfig, inject_adapter_in_model, set_peft_model_state_dict
        from peft.utils import load_peft_weights

        path = self._resolve(self._sources[name])
        config = PeftConfig.from_pretrained(str(path))
        config.inference_mode = True
        weights = strip_saved_prefix(load_peft_weights(str(path), device=str(self._model.device)))
        with self._model_lock, warnings.catch_warnings():
            # peft warns that a model holding one adapter gets another: holding several is the point.
            warnings.filterwarnings("ignore", message="Already found a `peft_config`")
            inject_adapter_in_model(config, self._model, adapter_name=name)
            result = set_peft_model_state_dict(self._model, weights, adapter_name=name)
            self._settle_layers()
        missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if missing:
            log.warning("adapter %s: %d weights matched no layer, e.g. %s", name, len(missing), missing[0])
        log.info("adapter %s loaded from %s", name, self._sources[name])

    def _unload(self, name: str) -> None:
        from peft.functional import delete_adapter

        with self._model_lock:
            delete_adapter(self._model, adapter_name=name, prefix="lora_")
            self._settle_layers()
        log.info("adapter %s unloaded (least recently used)", name)

    def _settle_layers(self) -> None:
        """Every LoRA layer: no active adapter of its own (only an assignment applies one) and hooked."""
        from peft.tuners.lora import LoraLayer

        layers: list[Any] = [m for m in self._model.modules() if isinstance(m, LoraLayer)]
        for layer in layers:
            layer.set_adapter([], inference_mode=True)
            if id(layer) not in self._hooked:
                layer.register_forward_pre_hook(self._before_layer, with_kwargs=True)
                layer.register_forward_hook(self._after_layer, with_kwargs=True)
                self._hooked.add(id(layer))

    # ---- the forward pass -------------------------------------------------------------------------

    def _wrap_forward(self) -> None:
        original = self._model.forward

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            with self._model_lock:
                self._assignment = self._assign(kwargs)
                try:
                    return original(*args, **kwargs)
                finally:
                    self._assignment = None

        self._model.forward = forward

    def _assign(self, kwargs: Mapping[str, Any]) -> Assignment:
        """This pass's assignment: one name per token of a packed continuous batch, or the serial path's
        adapter for every sample, or None (the base alone)."""
        bounds = kwargs.get("cu_seq_lens_q")
        if bounds is not None and self.batch_names is not None:
            names = self.batch_names()
            if all(name == BASE for name in names):
                return None
            ids = kwargs["input_ids"]
            return token_names(names, [int(b) for b in bounds.tolist()], int(ids.shape[-1]))
        return self._whole

    def _before_layer(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        assignment = self._assignment
        if assignment is None or not args:
            return None
        x = args[0]
        if isinstance(assignment, str):
            return args, {**kwargs, "adapter_names": [assignment] * int(x.shape[0])}
        return (x.transpose(0, 1), *args[1:]), {**kwargs, "adapter_names": assignment}

    def _after_layer(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        if isinstance(self._assignment, list):
            return output.transpose(0, 1)
        return None

    def close(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)


def attach_adapters(task: Any, config: ServerConfig) -> AdapterBank | None:
    """The bank of a loaded text-generation task's ``--adapter``s, set as ``task.adapters`` (None: none
    declared, or a ``--handler`` task, which reads ``GenerationItem.adapter`` itself); nothing is loaded
    until a request names one."""
    if not config.adapters:
        return None
    from model_server.tasks.text_generation import TextGenerationTask

    if not isinstance(task, TextGenerationTask):
        log.info("adapters: a --handler task gets each request's adapter name and applies it itself")
        return None
    resolve = functools.partial(sources.resolve, hf_home=config.hf_home, pvc_root=config.pvc_root)
    bank = AdapterBank(task._model, config.adapters, config.max_adapters, resolve)
    task.adapters = bank
    return bank


__all__ = [
    "BASE",
    "AdapterBank",
    "attach_adapters",
    "lru_evictions",
    "strip_saved_prefix",
    "token_names",
]
