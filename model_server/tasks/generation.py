"""Autoregressive generation shared by text-generation and vision: the context-window check, sampling
arguments, stop sequences and token streaming around ``model.generate``.

Stop sequences and streaming are one mechanism.  A streamer receives each new token from ``generate`` on
the inference thread, decodes it incrementally (``Detokenizer``: a window of the last tokens, never the
whole completion again) and hands the new text to a ``StopText`` accumulator, which decides what may be
emitted now: text up to the first stop string (generation then stops), minus any tail that could still
grow into a stop string or is an incomplete UTF-8 character.  Both look at a bounded tail only, so a
token costs the same at the end of a long completion as at its start.  The final text is exactly
the concatenation of the emitted pieces, so a streaming client and a non-streaming client see the same
text.  ``emit`` is called on the inference thread; the route's emitter must hand the piece to the event
loop without blocking (``loop.call_soon_threadsafe``).

Generation stops when nobody waits: the worker sets the unit's cancel check (``watching_cancel``) around
the task's run, and a stopping criterion polls it after every token, so a disconnected client or a
passed deadline frees the inference thread at the next token instead of after ``max_tokens``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from model_server.errors import InvalidInput
from model_server.tasks.base import Emitter, GenerationParams, GenerationResult, Task, TensorSpec

TEXT_OUTPUT = TensorSpec("text_output", "BYTES", (-1,))

_REPLACEMENT = "\ufffd"  # what a tokenizer decodes half of a multi-byte character to

# Tokenizers without a real limit report a huge sentinel as model_max_length.
_NO_LIMIT = 1_000_000


def context_length(config: Any, tokenizer: Any) -> int | None:
    """The model's context window: from the config, else the tokenizer's ``model_max_length``."""
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < _NO_LIMIT else None


def check_context(
    prompt_tokens: int, max_tokens: int, context: int | None, *, allow_empty: bool = False
) -> None:
    """Pure: 400 (with OpenAI's wording) when prompt + completion cannot fit the context window."""
    if prompt_tokens == 0 and not allow_empty:
        raise InvalidInput("the prompt is empty")
    if context is not None and prompt_tokens + max_tokens > context:
        raise InvalidInput(
            f"this model's maximum context length is {context} tokens, but {prompt_tokens + max_tokens} "
            f"were requested ({prompt_tokens} in the prompt, {max_tokens} for the completion); "
            "shorten the prompt or lower max_tokens"
        )


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Pure: length of the longest suffix of ``text`` that is a proper prefix of some stop string (it may
    become a stop once more tokens arrive, so it must not be emitted yet)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


@dataclass
class StopText:
    """Pure accumulator: the completion's newly decoded text in (``Detokenizer.text``: never half a
    character), the next safe-to-emit piece out.  It looks
    only at the tail: the text held back, the new text, and as much of what was sent as the longest stop
    string could reach back into."""

    stops: tuple[str, ...] = ()
    sent: str = ""
    stopped: bool = False  # a stop string was found: the completion is final
    held: str = ""  # decoded but not emitted yet (may grow into a stop string, or half a character)

    def push(self, new: str, final: bool = False) -> str:
        """Add the text decoded since the last call; return the new piece that may be emitted now."""
        if self.stopped:
            return ""
        reach = max((len(stop) for stop in self.stops), default=1) - 1
        context = self.sent[max(0, len(self.sent) - reach) :]
        window = context + self.held + new
        cuts = [i for i in (window.find(stop) for stop in self.stops) if i >= 0]
        if cuts:  # a stop cannot begin in the sent text: held_back kept any start of one unsent
            window, final, self.stopped = window[: max(len(context), min(cuts))], True, True
        text = window[len(context) :]
        safe = len(text)
        if not final:  # (half characters never arrive: the detokenizer holds them)
            safe -= min(safe, held_back(window, self.stops))
        piece, self.held = text[:safe], "" if final else text[safe:]
        self.sent += piece
        return piece


class Detokenizer:
    """Incremental decoding of one completion (text-generation-inference's and vLLM's way): decode the
    window of tokens from ``prefix`` (those before the last emitted text, the context a tokenizer needs for
    leading spaces) and emit what it adds beyond the text of ``prefix:read``, once it does not end in half
    a UTF-8 character.  Each call decodes a few tokens, never the whole completion."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # the window's start
        self._read = 0  # the tokens before this are emitted as text

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def text(self, final: bool = False) -> str:
        """The text the tokens added since the last call decode to ('' while it is half a character;
        ``final``: whatever is left, half characters included)."""
        if self._read == len(self.ids):
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        window = self._decode(self.ids[self._prefix :])
        if len(window) > len(before) and (final or not window.endswith(_REPLACEMENT)):
            self._prefix, self._read = self._read, len(self.ids)
            return window[len(before) :]
        return ""


class _Streamer:
    """The ``streamer`` protocol of ``generate`` (``put``/``end``): collects the new token ids, feeds the
    text they add (``Detokenizer``) to ``StopText`` and emits what it releases.  The first ``put`` carries the
    prompt (or the decoder's start ids) and is skipped."""

    def __init__(self, tokenizer: Any, text: StopText, emit: Emitter | None, incremental: bool) -> None:
        self._detokenizer = Detokenizer(tokenizer)
        self._text = text
        self._emit = emit
        self._incremental = incremental  # decode per token only when streaming or watching for stops
        self._prompt_seen = False
        self.ids = self._detokenizer.ids

    def _push(self, final: bool) -> None:
        piece = self._text.push(self._detokenizer.text(final=final), final=final)
        if piece and self._emit is not None:
            self._emit(piece)

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if self._text.stopped:
            return
        self.ids.extend(int(i) for i in value.reshape(-1).tolist())
        if self._incremental:
            self._push(final=False)

    def end(self) -> None:
        self._push(final=True)


_cancel = threading.local()  # the running unit's cancel check, on the inference thread


@contextlib.contextmanager
def watching_cancel(cancelled: Callable[[], bool] | None) -> Iterator[None]:
    """While the block runs (on the inference thread), generations poll ``cancelled`` after each token."""
    previous = getattr(_cancel, "check", None)
    _cancel.check = cancelled
    try:
        yield
    finally:
        _cancel.check = previous


def nobody_waits() -> bool:
    """Has the running unit's client gone (disconnected, deadline passed)?"""
    check: Callable[[], bool] | None = getattr(_cancel, "check", None)
    return check is not None and check()


def sampling_kwargs(params: GenerationParams) -> dict[str, Any]:
    """OpenAI sampling parameters -> ``generate`` keyword arguments (temperature 0 means greedy)."""
    if params.temperature == 0.0:
        return {"do_sample": False}
    # top_k=0 disables the model's default top-k so that only OpenAI's temperature/top_p apply.
    return {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends generation: the generation config's eos (int or list) and the tokenizer's."""
    found: set[int] = set()
    for value in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, list | tuple):
            found.update(int(v) for v in value)
    return found


def ensure_pad_token(model: Any, tokenizer: Any) -> None:
    """Give the generation config a pad token when it has none (the tokenizer's, else end-of-sequence), once
    at load: ``generate`` warns on every call otherwise.  Set here rather than passed to ``generate``
    because some models' own ``generate`` (BLIP) passes it themselves."""
    config = model.generation_config
    if config.pad_token_id is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        config.pad_token_id = pad


def generate(
    model: Any,
    *,
    tokenizer: Any,
    inputs: Mapping[str, Any],
    prompt_tokens: int,
    params: GenerationParams,
    emit: Emitter | None,
) -> GenerationResult:
    """Run ``model.generate`` on prepared ``inputs`` (tensors already on the model's device) with the
    request's sampling parameters, stop strings and optional streaming; called on the inference thread."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    text = StopText(params.stop)
    streamer = _Streamer(tokenizer, text, emit, incremental=bool(params.stop) or emit is not None)

    class _StopOnText(StoppingCriteria):
        """Ends generation once ``StopText`` has seen a stop string."""

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            done = text.stopped or nobody_waits()
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

    if emit is not None:
        emit("")  # no text: the route may send its headers (the model has taken the request)
    if params.seed is not None:
        torch.manual_seed(params.seed)  # seeds every device; generation runs on this one thread
    with torch.inference_mode():
        model.generate(
            **inputs,
            max_new_tokens=params.max_tokens,
            streamer=streamer,
            stopping_criteria=StoppingCriteriaList([_StopOnText()]),
            **sampling_kwargs(params),
        )
    ended_on_eos = bool(streamer.ids) and streamer.ids[-1] in eos_ids(model, tokenizer)
    length = len(streamer.ids) >= params.max_tokens and not text.stopped and not ended_on_eos
    return GenerationResult(
        text=text.sent,
        finish_reason="length" if length else "stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=len(streamer.ids),
    )


GenerationItemT = TypeVar("GenerationItemT")
# The warm-up generates this little: the first call's set-up is what it is for.
WARMUP_PARAMS = GenerationParams(max_tokens=2, temperature=0.0)


class AdapterChoice(Protocol):
    """The LoRA adapters of a loaded model (``engine.adapters.AdapterBank``), as the serial path uses them."""

    def applied(self, name: str | None) -> AbstractContextManager[None]: ...


class GenerativeTask(Task[GenerationItemT, GenerationResult]):
    """What text-generation and vision share: a model behind ``generate``, its tokenizer and context
    window, one item at a time (not batchable), and the v2 output ``text_output`` BYTES [-1]."""

    batchable: ClassVar[bool] = False
    v2_outputs: ClassVar[tuple[TensorSpec, ...]] = (TEXT_OUTPUT,)

    def __init__(self) -> None:
        self._model: Any = None
        self._tokenizer: Any = None
        self._device = "cpu"
        self._context: int | None = None
        # Set by the worker after the load when the model has LoRA adapters (``--adapter``).
        self.adapters: AdapterChoice | None = None

    def max_input_tokens(self) -> int | None:
        return self._context

    def _generate(
        self, inputs: Mapping[str, Any], prompt_tokens: int, params: GenerationParams, emit: Emitter | None
    ) -> GenerationResult:
        return generate(
            self._model,
            tokenizer=self._tokenizer,
            inputs=inputs,
            prompt_tokens=prompt_tokens,
            params=params,
            emit=emit,
        )

    def encode_v2(self, results: Sequence[GenerationResult]) -> dict[str, npt.NDArray[Any]]:
        return {TEXT_OUTPUT.name: np.array([r.text.encode("utf-8") for r in results], dtype=np.object_)}
