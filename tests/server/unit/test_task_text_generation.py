"""text-generation through the real task class and a tiny GPT-2 saved to disk: greedy and seeded sampling,
stop sequences, streaming, chat templates, limits, and the v2 codec.  Plus the pure stop/stream logic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_server.errors import InvalidInput
from model_server.tasks.base import GenerationItem, GenerationParams, GenerationResult
from model_server.tasks.generation import Detokenizer, StopText, check_context, held_back, sampling_kwargs
from model_server.tasks.params import generation_params
from model_server.tasks.text_generation import TextGenerationTask
from testkit.tiny_models import build_tokenizer
from tests.server.tiny_fixtures import load_task, tiny_text_generation, torch_threads

__all__ = ["tiny_text_generation"]  # the session fixture, re-exported for pytest

GREEDY = GenerationParams(max_tokens=24, temperature=0.0)


@pytest.fixture(scope="module")
def task(tiny_text_generation: Path) -> Iterator[TextGenerationTask]:
    with torch_threads(1):
        yield load_task(TextGenerationTask(), tiny_text_generation)


def run_one(
    task: TextGenerationTask, item: GenerationItem, pieces: list[str] | None = None
) -> GenerationResult:
    [result] = task.run([item], emit=None if pieces is None else pieces.append)
    return result


# ---- pure logic --------------------------------------------------------------------------------------


def test_held_back_is_the_longest_suffix_that_may_grow_into_a_stop() -> None:
    assert held_back("hello wor", ("world",)) == 3
    assert held_back("hello", ("world",)) == 0
    assert held_back("ab", ("abc", "bx")) == 2
    assert held_back("abc", ("abc",)) == 0  # a complete stop is cut, not held


def test_stop_text_cuts_at_the_first_stop_and_pieces_join_to_the_result() -> None:
    acc = StopText(("END", "!!"))
    stream = ["Hel", "lo E", "x the", "re!", "! more"]
    pieces = [acc.push(text) for text in stream]
    assert acc.stopped
    assert acc.sent == "Hello Ex there"
    assert "".join(pieces) == acc.sent
    assert pieces[1:3] == ["lo ", "Ex the"]  # "E" held back: it may start "END"
    assert acc.push(" more", final=True) == ""


def test_stop_text_finds_a_stop_spread_over_pieces_and_flushes_the_held_tail_at_the_end() -> None:
    acc = StopText(("END",))
    assert [acc.push(p) for p in ("x E", "N", "D y")] == ["x ", "", ""]
    assert acc.stopped and acc.sent == "x "
    held = StopText(("END",))
    assert held.push("ab EN") == "ab " and held.push("", final=True) == "EN"  # no stop came: all is sent


MULTI_BYTE = [
    "héllo wörld, ça va? naïve café",
    "日本語のテキストと English mixed",
    "emoji 🙂🚀 and ümlauts äöü ß",
    "Ελληνικά κείμενα και русский текст",
]


class CountingTokenizer:
    """A real tokenizer that records how many ids each ``decode`` call was given."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.decoded: list[int] = []

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self.decoded.append(len(ids))
        return str(self.tokenizer.decode(ids, **kwargs))


@pytest.fixture(scope="module")
def byte_level() -> Any:
    """A byte-level BPE (GPT-2's scheme) trained offline with few merges: most characters outside ASCII
    span several tokens, so half a character is decoded on the way."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([*MULTI_BYTE, "hello world the quick brown fox"], trainer=trainer)
    tf: Any = transformers
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)


def stream(tokenizer: Any, ids: list[int], stops: tuple[str, ...] = ()) -> tuple[list[str], StopText]:
    """Feed ``ids`` one token at a time through a Detokenizer and a StopText, as the engine does."""
    detokenizer, text = Detokenizer(tokenizer), StopText(stops)
    pieces = []
    for index, token in enumerate(ids):
        detokenizer.ids.append(token)
        final = index == len(ids) - 1
        pieces.append(text.push(detokenizer.text(final=final), final=final))
    return pieces, text


@pytest.mark.parametrize("scheme", ["byte-level", "metaspace"])
def test_streamed_text_equals_the_whole_decode_multi_byte_characters_included(
    scheme: str, byte_level: Any
) -> None:
    tokenizer = byte_level if scheme == "byte-level" else build_tokenizer()
    for sentence in [*MULTI_BYTE, "Hello, world!  two  spaces and the quick brown fox"]:
        ids = tokenizer(sentence, add_special_tokens=False)["input_ids"]
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        pieces, text = stream(tokenizer, ids)
        assert "".join(pieces) == text.sent == whole, (sentence, pieces)
        assert all("\ufffd" not in piece for piece in pieces) or "\ufffd" in whole
        if scheme == "byte-level" and not sentence.isascii():
            assert "" in pieces[:-1]  # some token ended inside a character: held until it was whole


def test_stop_strings_and_decoding_look_at_a_bounded_window(byte_level: Any) -> None:
    sentence = " ".join(MULTI_BYTE * 8) + " THE END and more"
    ids = byte_level(sentence, add_special_tokens=False)["input_ids"]
    assert len(ids) > 400
    counting = CountingTokenizer(byte_level)
    pieces, text = stream(counting, ids, stops=("THE END", "ß κείx"))
    assert text.stopped and "".join(pieces) == text.sent == sentence[: sentence.index(" THE END") + 1]
    assert max(counting.decoded) <= 16, counting.decoded  # never the whole completion again


def test_temperature_zero_is_greedy() -> None:
    assert sampling_kwargs(GenerationParams(temperature=0.0)) == {"do_sample": False}
    sampled = sampling_kwargs(GenerationParams(temperature=0.7, top_p=0.9))
    assert sampled["do_sample"] is True and sampled["temperature"] == 0.7 and sampled["top_p"] == 0.9


def test_context_check_uses_openai_wording() -> None:
    check_context(10, 20, 128)
    with pytest.raises(InvalidInput, match="maximum context length is 128"):
        check_context(120, 20, 128)
    with pytest.raises(InvalidInput, match="empty"):
        check_context(0, 1, None)


# ---- the real model --------------------------------------------------------------------------------------


def test_greedy_is_deterministic_and_stops_at_max_tokens(task: TextGenerationTask) -> None:
    item = GenerationItem(prompt="Once upon a time", params=GREEDY)
    first, second = run_one(task, item), run_one(task, item)
    assert first == second
    assert first.text
    assert first.finish_reason == "length"
    assert first.completion_tokens == GREEDY.max_tokens
    assert first.prompt_tokens > 0
    assert task.max_input_tokens() == 128


def test_seed_makes_sampling_reproducible(task: TextGenerationTask) -> None:
    params = GenerationParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=1234)
    item = GenerationItem(prompt="The quick brown fox", params=params)
    assert run_one(task, item) == run_one(task, item)
    others = {
        run_one(
            task, GenerationItem(prompt="The quick brown fox", params=GenerationParams(16, 1.0, 1.0, (), s))
        ).text
        for s in range(5)
    }
    assert len(others) > 1, "different seeds should not all sample the same text"


def test_stop_sequence_cuts_the_text(task: TextGenerationTask) -> None:
    item = GenerationItem(prompt="Hello, world!", params=GREEDY)
    full = run_one(task, item).text
    # The first character that differs from the first one starts a stop string that cannot occur earlier.
    index = next(i for i, ch in enumerate(full) if ch != full[0])
    stop = full[index : index + 2]
    stopped = run_one(
        task, GenerationItem(prompt="Hello, world!", params=GenerationParams(24, 0.0, stop=(stop,)))
    )
    assert stopped.text == full[:index]
    assert stopped.finish_reason == "stop"
    assert stopped.completion_tokens < GREEDY.max_tokens


def test_streaming_pieces_join_to_the_final_text(task: TextGenerationTask) -> None:
    item = GenerationItem(prompt="A man is eating", params=GREEDY)
    pieces: list[str] = []
    streamed = run_one(task, item, pieces)
    assert len(pieces) > 1
    assert "".join(pieces) == streamed.text == run_one(task, item).text


def test_streaming_with_a_stop_never_emits_the_stop(task: TextGenerationTask) -> None:
    full = run_one(task, GenerationItem(prompt="A man is riding", params=GREEDY)).text
    index = next(i for i, ch in enumerate(full) if ch != full[0])
    stop = full[index : index + 2]
    pieces: list[str] = []
    item = GenerationItem(prompt="A man is riding", params=GenerationParams(24, 0.0, stop=(stop,)))
    result = run_one(task, item, pieces)
    assert "".join(pieces) == result.text == full[:index]
    assert stop not in "".join(pieces)


def test_chat_messages_use_the_tokenizer_template(task: TextGenerationTask) -> None:
    messages = ({"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"})
    item = GenerationItem(prompt="user: hello\nassistant:", params=GREEDY, messages=messages)
    rendered, templated = task.render(item)
    assert templated
    assert rendered == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    )
    result = run_one(task, item)
    plain = run_one(task, GenerationItem(prompt=item.prompt, params=GREEDY))
    assert result.prompt_tokens > plain.prompt_tokens  # the template's special tokens were counted
    assert result.completion_tokens == GREEDY.max_tokens


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (GenerationItem(prompt="", params=GREEDY), "empty"),
        (GenerationItem(prompt="   ", params=GREEDY), "empty"),
        (GenerationItem(prompt="hi", params=GenerationParams(max_tokens=0)), "max_tokens"),
        (GenerationItem(prompt="hi", params=GenerationParams(temperature=-1.0)), "temperature"),
        (GenerationItem(prompt="hi", params=GenerationParams(top_p=0.0)), "top_p"),
        (GenerationItem(prompt="hi", params=GenerationParams(stop=("",))), "stop"),
        (GenerationItem(prompt="hi", params=GenerationParams(stop=("a", "b", "c", "d", "e"))), "stop"),
        (GenerationItem(prompt="hello " * 200, params=GREEDY), "maximum context length"),
        (GenerationItem(prompt="hi", params=GenerationParams(max_tokens=200)), "maximum context length"),
    ],
)
def test_bad_input_is_invalid_input(task: TextGenerationTask, item: GenerationItem, reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        task.run([item])


def test_after_bad_input_the_next_request_succeeds(task: TextGenerationTask) -> None:
    with pytest.raises(InvalidInput):
        task.run([GenerationItem(prompt="", params=GREEDY)])
    assert run_one(task, GenerationItem(prompt="hi", params=GenerationParams(4, 0.0))).completion_tokens == 4


# ---- v2 codec ----------------------------------------------------------------------------------------------


def test_v2_round_trip(task: TextGenerationTask) -> None:
    inputs = {"text_input": np.array([b"Hello", "wörld".encode()], dtype=np.object_)}
    params = {"max_tokens": 5, "temperature": 0, "stop": '["xyz", "!"]', "seed": 7}
    items = task.decode_v2(inputs, params)
    assert [i.prompt for i in items] == ["Hello", "wörld"]
    assert items[0].params == GenerationParams(5, 0.0, 1.0, ("xyz", "!"), 7)
    results = task.run(items)
    encoded = task.encode_v2(results)
    assert encoded["text_output"].dtype == np.object_
    assert [x.decode() for x in encoded["text_output"]] == [r.text for r in results]
    assert all(r.completion_tokens <= 5 for r in results)


@pytest.mark.parametrize(
    ("inputs", "parameters", "reason"),
    [
        ({}, {}, "missing input tensor 'text_input'"),
        ({"text_input": np.array([1, 2], dtype=np.int32)}, {}, "BYTES"),
        ({"text_input": np.array([b"\xff\xfe"], dtype=np.object_)}, {}, "UTF-8"),
        ({"text_input": np.array([b"hi"], dtype=np.object_)}, {"max_tokens": "many"}, "max_tokens"),
        ({"text_input": np.array([b"hi"], dtype=np.object_)}, {"max_tokens": 1.5}, "integer"),
        ({"text_input": np.array([b"hi"], dtype=np.object_)}, {"temperature": 9}, "temperature"),
        ({"text_input": np.array([b"hi"], dtype=np.object_)}, {"stop": "[1, 2]"}, "stop"),
        ({"text_input": np.array([b"hi"], dtype=np.object_)}, {"seed": True}, "seed"),
    ],
)
def test_v2_bad_input(
    task: TextGenerationTask, inputs: dict[str, np.ndarray], parameters: dict[str, object], reason: str
) -> None:
    with pytest.raises(InvalidInput, match=reason):
        task.decode_v2(inputs, parameters)


def test_v2_parameters_default_to_openai_defaults() -> None:
    assert generation_params({}) == GenerationParams()
    assert generation_params({"stop": "END"}).stop == ("END",)
