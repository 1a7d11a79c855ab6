"""The echo models: ``--handler`` test classes, real ``Task`` implementations with controllable behaviour
and no weights (the server, host and gateway tests, the operator's and gateway's process-node pools, the
benchmarks and the demo start them).

The server process imports these as ``testkit.echo_models:Class`` (the repository root is on its
PYTHONPATH; ``handler_name`` spells that, ``ECHO`` and ``GENERATION`` are the two most started).
Behaviour knobs come from the environment so one class serves many tests:

* ``HANDLER_LOAD_SECONDS``: the load spins the CPU (pure Python, holding the GIL as a real load would)
  for this long;
* ``HANDLER_LOAD_GATE``: a file path; the load keeps spinning until that file exists (at most 120 s), so a
  test decides when loading ends instead of racing a timer;
* ``HANDLER_RUN_SECONDS``: each ``run`` sleeps this long (a slow forward pass);
* ``HANDLER_RUN_GATE``: a file path; each ``run`` waits until that file exists (at most 120 s), so a test
  holds work in the worker for exactly as long as it needs;
* ``HANDLER_EMIT_GATE``: a file path; a streamed generation waits after its first piece until that
  file exists (at most 120 s);
* ``HANDLER_RECORD``: a file each ``run`` appends its texts to (proves what was, or was not, computed).

``FailsAfterAdmission`` fails requests after admission, in the HTTP process (see the class).

Texts that trigger failures: ``boom`` (the forward pass raises), ``fatal`` (a CUDA illegal-memory-access
error), ``oom`` (CUDA out of memory whenever the unit holds more than one item), ``bad`` (InvalidInput).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from model_server.errors import InvalidInput
from model_server.tasks.base import (
    Embedding,
    Emitter,
    GenerationItem,
    GenerationResult,
    LoadOptions,
    Task,
    TensorSpec,
    TextItem,
    bytes_items,
    decode_text,
    require_tensor,
)
from testkit.waiting import WaitTimeoutError, wait_for

TEXT = TensorSpec("text", "BYTES", (-1,))
EMBEDDING = TensorSpec("embedding", "FP32", (-1, 2))


def _wait_for(gate: str | None) -> None:
    """Sleep (not spin: the worker's other threads keep the CPU) until ``gate`` exists, at most 120 s; then
    go on all the same (a test that never opens its gate fails on its own bound, not inside the model)."""
    if gate:
        with contextlib.suppress(WaitTimeoutError):
            wait_for(lambda: os.path.exists(gate), 120.0, 0.01, f"gate {gate}")


def _spin(seconds: float, gate: str | None = None) -> None:
    end = time.monotonic() + (120.0 if gate else seconds)
    x = 0
    while time.monotonic() < end:
        for _ in range(10_000):
            x = (x * 31 + 7) % 1_000_003  # pure-Python work: holds the GIL between switch intervals
        if gate and os.path.exists(gate):
            return


class EchoEmbedding(Task[TextItem, Embedding]):
    """A batchable text-embedding stand-in: vector = [len(text), number of items in the unit]."""

    name = "text-embedding"
    batchable = True
    v2_inputs = (TEXT,)
    v2_outputs = (EMBEDDING,)

    def load(self, options: LoadOptions) -> None:
        _spin(float(os.environ.get("HANDLER_LOAD_SECONDS", "0")), os.environ.get("HANDLER_LOAD_GATE"))
        self.run_seconds = float(os.environ.get("HANDLER_RUN_SECONDS", "0"))
        self.record = os.environ.get("HANDLER_RECORD")

    def run(self, items: Sequence[TextItem], emit: Emitter | None = None) -> list[Embedding]:
        texts = [i.text for i in items]
        if self.record:
            with open(self.record, "a") as f:
                f.write("".join(t + "\n" for t in texts))
        _wait_for(os.environ.get("HANDLER_RUN_GATE"))
        if self.run_seconds:
            time.sleep(self.run_seconds)
        if "bad" in texts:
            raise InvalidInput("the text 'bad' is refused by this model")
        if "boom" in texts:
            raise RuntimeError("forward pass exploded")
        if "fatal" in texts:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if "oom" in texts and len(texts) > 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [Embedding(np.array([len(t), len(items)], dtype=np.float32), tokens=len(t)) for t in texts]

    def decode_v2(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> list[TextItem]:
        array = require_tensor(inputs, TEXT)
        if array.ndim != 1:
            raise InvalidInput(f"input tensor 'text' must have shape [N], got {list(array.shape)}")
        return [TextItem(decode_text(b, "text")) for b in bytes_items(array, "text")]

    def encode_v2(self, results: Sequence[Embedding]) -> dict[str, npt.NDArray[Any]]:
        return {"embedding": np.stack([r.vector for r in results])}


class WarmEcho(EchoEmbedding):
    """``EchoEmbedding`` with a warm-up input (the text ``warm-up``, recorded like any other)."""

    def warmup_items(self) -> list[TextItem]:
        return [TextItem("warm-up")]


class FailingLoad(EchoEmbedding):
    """The load raises (bad weights): the server must end Failed with exit code 3."""

    def load(self, options: LoadOptions) -> None:
        raise OSError(f"weights file missing in {options.path}")


class EchoGeneration(Task[GenerationItem, GenerationResult]):
    """A streaming text-generation stand-in: 'generates' the prompt's words back, one per emit (after
    ``[<adapter>]`` when the request named a LoRA adapter of the pool: what the worker applied)."""

    name = "text-generation"
    batchable = False
    v2_inputs = (TensorSpec("text_input", "BYTES", (-1,)),)
    v2_outputs = (TensorSpec("text_output", "BYTES", (-1,)),)

    def load(self, options: LoadOptions) -> None:
        self.run_seconds = float(os.environ.get("HANDLER_RUN_SECONDS", "0"))

    def run(self, items: Sequence[GenerationItem], emit: Emitter | None = None) -> list[GenerationResult]:
        out = []
        for item in items:
            words = item.prompt.split()[: item.params.max_tokens]
            if item.adapter is not None:
                words = [f"[{item.adapter}]", *words][: item.params.max_tokens]
            for k, w in enumerate(words):
                if emit is not None:
                    emit(w + " ")
                    if k == 0:
                        _wait_for(os.environ.get("HANDLER_EMIT_GATE"))
                if self.run_seconds:
                    time.sleep(self.run_seconds)
            finish: Literal["stop", "length"] = (
                "length" if len(item.prompt.split()) > item.params.max_tokens else "stop"
            )
            out.append(GenerationResult(" ".join(words), finish, len(item.prompt.split()), len(words)))
        return out

    def decode_v2(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> list[GenerationItem]:
        array = require_tensor(inputs, self.v2_inputs[0])
        return [GenerationItem(decode_text(b, "text_input")) for b in bytes_items(array, "text_input")]

    def encode_v2(self, results: Sequence[GenerationResult]) -> dict[str, npt.NDArray[Any]]:
        out = np.empty(len(results), dtype=object)
        out[:] = [r.text.encode() for r in results]
        return {"text_output": out}


class _Unpicklable(TextItem):
    """A text item that cannot cross to the inference process (pickling it raises)."""

    def __reduce__(self) -> Any:
        raise TypeError("this item cannot be pickled")


class FailsAfterAdmission(EchoEmbedding):
    """``EchoEmbedding`` whose requests can fail in the HTTP process after their door slot is taken:
    the text ``nohint`` makes ``length_hint`` raise, and the text ``unpicklable`` (v2 route) decodes to an
    item that cannot be sent to the inference process."""

    def length_hint(self, item: TextItem) -> int:
        if item.text == "nohint":
            raise ValueError("no length hint for this text")
        return len(item.text)

    def decode_v2(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> list[TextItem]:
        items = super().decode_v2(inputs, parameters)
        return [_Unpicklable(i.text) if i.text == "unpicklable" else i for i in items]


def handler_name(task: type[Task[Any, Any]]) -> str:
    """The ``--handler`` value (``module:Class``) by which the server imports ``task`` in its processes."""
    return f"{task.__module__}:{task.__qualname__}"


ECHO = handler_name(EchoEmbedding)
GENERATION = handler_name(EchoGeneration)
