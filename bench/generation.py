"""Continuous batching against one request at a time, on the same model and prompts, in one run.

``python -m bench.generation`` builds a model of ``--shape`` with random weights and the tokenizer of the
tests' tiny models: ``tiny`` (a Llama, 4 layers, hidden 256: the CPU figure) or ``qwen2.5-0.5b`` (a Qwen2
of Qwen2.5-0.5B's shape: 24 layers, hidden 896, its 151,936-token vocabulary, tied embeddings; for a GPU,
``--device cuda --dtype bfloat16``).  ``--layers`` overrides the layer count (a quick check of a large
shape on the CPU).  It loads the model through the real text-generation task and attaches the
continuous-batching engine (``model_server/engine/generation_engine.py``).  Then, interleaved for
``--rounds`` rounds: ``--concurrent`` greedy streamed requests of ``--tokens`` new tokens each, once
submitted together to the engine and once one after another through ``generate`` (the serial path, all
of them waiting from the same start); and one request alone on each.  It prints generated tokens per
second of each and the ratios (medians over the rounds), the p95 time to first token of the concurrent
requests on each path (over every round), with the load average beside them: on a shared machine the
ratio, measured in one process, is the figure to read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    "Hello, world! The quick brown fox",
    "A man is eating food.",
    "Once upon a time there was a tiny model",
    "What is in this picture?",
]


# Qwen2.5-0.5B's config.json (the architecture's numbers; the weights here are random).
QWEN_05B: dict[str, Any] = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
SHAPES = ("tiny", "qwen2.5-0.5b")


def build_model(out: Path, shape: str = "tiny", layers: int | None = None, dtype: str = "float32") -> Path:
    """A random model of ``shape`` (``layers`` overriding its depth) with the tests' tokenizer, saved in
    ``dtype``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from testkit.tiny_models import build_tokenizer

    tokenizer = build_tokenizer(model_max_length=2048)
    torch.manual_seed(0)
    special = {
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,  # both paths stop on it alike; tokens/s counts what was made
        "pad_token_id": tokenizer.pad_token_id,
    }
    model: Any
    if shape == "tiny":
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=layers or 4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            **special,
        )
        model = LlamaForCausalLM(config)
    else:
        qwen = {**QWEN_05B, "num_hidden_layers": layers or QWEN_05B["num_hidden_layers"]}
        model = Qwen2ForCausalLM(Qwen2Config(**qwen, **special))
        # The tokenizer knows a few hundred ids: the output rows of the others, and of the end of text,
        # are zero, so the greedy choice (random logits, the largest is positive) is always a token that
        # decodes to text and every request makes its --tokens tokens, while the output layer still costs
        # the whole vocabulary's product.
        with torch.no_grad():
            weight = model.get_output_embeddings().weight
            weight[len(tokenizer) :] = 0
            weight[tokenizer.eos_token_id] = 0
    model.to(getattr(torch, dtype)).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def items(count: int, tokens: int) -> list[Any]:
    from model_server.tasks.base import GenerationItem, GenerationParams

    params = GenerationParams(max_tokens=tokens, temperature=0.0)
    return [GenerationItem(prompt=PROMPTS[i % len(PROMPTS)] + f" {i}", params=params) for i in range(count)]


class FirstTokens:
    """When each request's first text came (the engine emits on its own thread), from one start."""

    def __init__(self, count: int) -> None:
        self.start = time.perf_counter()
        self.at: list[float | None] = [None] * count

    def emitter(self, index: int) -> Any:
        def emit(piece: str) -> None:
            if piece and self.at[index] is None:  # "" only says the request was taken
                self.at[index] = time.perf_counter() - self.start

        return emit

    def seconds(self, finished: list[float]) -> list[float]:
        """Each request's time to first text (its end when it made none: it stopped at once)."""
        return [first if first is not None else end for first, end in zip(self.at, finished, strict=True)]


def serial(task: Any, work: list[Any], firsts: list[float] | None = None) -> float:
    """Generated tokens per second, one request after another through ``generate``, each streamed; the
    requests' times to first text from the common start go to ``firsts``."""
    clock = FirstTokens(len(work))
    generated, finished = 0, []
    for index, item in enumerate(work):
        generated += task.run([item], emit=clock.emitter(index))[0].completion_tokens
        finished.append(time.perf_counter() - clock.start)
    if firsts is not None:
        firsts.extend(clock.seconds(finished))
    return generated / (time.perf_counter() - clock.start)


async def batched(engine: Any, work: list[Any], firsts: list[float] | None = None) -> float:
    """Generated tokens per second, every request submitted to the engine at once, each streamed."""
    from model_server.engine.unit import Unit

    loop = asyncio.get_running_loop()
    outcomes: list[asyncio.Future[Any]] = [loop.create_future() for _ in work]
    clock = FirstTokens(len(work))
    for index, (item, outcome) in enumerate(zip(work, outcomes, strict=True)):
        unit = Unit([item], time.monotonic() + 600, lambda _: None, emit=clock.emitter(index))
        engine.submit(unit, lambda _, result, future=outcome: future.set_result(result))
    finished = [0.0] * len(work)

    async def wait(index: int) -> Any:
        result = await outcomes[index]
        finished[index] = time.perf_counter() - clock.start
        return result

    results = await asyncio.gather(*(wait(k) for k in range(len(work))))
    elapsed = time.perf_counter() - clock.start
    for result in results:
        if not isinstance(result, list):
            raise RuntimeError(f"a request failed: {result}")
    if firsts is not None:
        firsts.extend(clock.seconds(finished))
    tokens: int = sum(r[0].completion_tokens for r in results)
    return tokens / elapsed


async def measure(task: Any, engine: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    names = ("batched", "serial", "one_batched", "one_serial", "ttft_batched", "ttft_serial")
    figures: dict[str, list[float]] = {name: [] for name in names}
    many, one = items(args.concurrent, args.tokens), items(1, args.tokens)
    await batched(engine, items(2, 4))  # warm-up of both paths
    serial(task, items(1, 4))
    for _ in range(args.rounds):
        figures["batched"].append(await batched(engine, many, figures["ttft_batched"]))
        figures["serial"].append(serial(task, many, figures["ttft_serial"]))
        figures["one_batched"].append(await batched(engine, one))
        figures["one_serial"].append(serial(task, one))
    return figures


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--shape", choices=SHAPES, default="tiny", help="the model's architecture and size")
    parser.add_argument("--layers", type=int, default=None, help="override the shape's layer count")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    args = parser.parse_args(argv)

    import torch

    from model_server.engine.generation_engine import attach
    from model_server.tasks.base import LoadOptions
    from model_server.tasks.text_generation import TextGenerationTask

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        task = TextGenerationTask()
        path = build_model(Path(tmp), args.shape, args.layers, args.dtype)
        task.load(LoadOptions(path=path, device=args.device, dtype=args.dtype))
    engine = attach(
        task, choice="batching", device=args.device, trust_remote_code=False, kv_tokens=None, on_fatal=print
    )
    assert engine is not None
    try:
        figures = asyncio.run(measure(task, engine, args))
    finally:
        engine.close()
    median = {name: statistics.median(values) for name, values in figures.items()}
    load = os.getloadavg()[0]
    layers = args.layers or (4 if args.shape == "tiny" else QWEN_05B["num_hidden_layers"])
    print(
        f"model: {args.shape} shape, {layers} layers, random weights; {args.device} {args.dtype}; "
        f"{args.threads} torch thread(s); load average {load:.1f}"
    )
    print(
        f"{args.concurrent} concurrent x {args.tokens} tokens: batched {median['batched']:.0f} tokens/s, "
        f"serial {median['serial']:.0f} tokens/s, ratio {median['batched'] / median['serial']:.2f}x"
    )
    first_batched, first_serial = p95(figures["ttft_batched"]) * 1000, p95(figures["ttft_serial"]) * 1000
    print(
        f"p95 time to first token of the {args.concurrent} (over {args.rounds} round(s)): "
        f"batched {first_batched:.0f} ms, serial {first_serial:.0f} ms"
    )
    alone = median["one_batched"] / median["one_serial"]
    print(
        f"1 request x {args.tokens} tokens: batched {median['one_batched']:.0f} tokens/s, "
        f"generate {median['one_serial']:.0f} tokens/s, ratio {alone:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
