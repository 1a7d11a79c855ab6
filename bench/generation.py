"""Continuous batching against one request at a time, on the same model and prompts, in one run.

``python -m bench.generation`` builds a random Llama-shaped model (4 layers, hidden 256, the tokenizer of
the tests' tiny models), loads it through the real text-generation task and attaches the
continuous-batching engine (``model_server/engine/generation_engine.py``).  Then, interleaved for ``--rounds``
rounds: ``--concurrent`` greedy requests of ``--tokens`` new tokens each, once submitted together to the
engine and once one after another through ``generate`` (the serial path); and one request alone on each.
It prints generated tokens per second of each and the ratios (medians over the rounds), with the load
average beside them: on a shared machine the ratio, measured in one process, is the figure to read.
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


def build_model(out: Path) -> Path:
    """A random 4-layer Llama (hidden 256) with the tests' tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from testkit.tiny_models import build_tokenizer

    tokenizer = build_tokenizer(model_max_length=2048)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,  # both paths stop on it alike; tokens/s counts what was made
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def items(count: int, tokens: int) -> list[Any]:
    from model_server.tasks.base import GenerationItem, GenerationParams

    params = GenerationParams(max_tokens=tokens, temperature=0.0)
    return [GenerationItem(prompt=PROMPTS[i % len(PROMPTS)] + f" {i}", params=params) for i in range(count)]


def serial(task: Any, work: list[Any]) -> float:
    """Generated tokens per second, one request after another through ``generate``."""
    started = time.perf_counter()
    generated = sum(task.run([item])[0].completion_tokens for item in work)
    return generated / (time.perf_counter() - started)


async def batched(engine: Any, work: list[Any]) -> float:
    """Generated tokens per second, every request submitted to the engine at once."""
    from model_server.engine.dataplane import Unit

    loop = asyncio.get_running_loop()
    outcomes: list[asyncio.Future[Any]] = [loop.create_future() for _ in work]
    started = time.perf_counter()
    for item, outcome in zip(work, outcomes, strict=True):
        unit = Unit([item], time.monotonic() + 600, lambda _: None)
        engine.submit(unit, lambda _, result, future=outcome: future.set_result(result))
    results = await asyncio.gather(*outcomes)
    elapsed = time.perf_counter() - started
    for result in results:
        if not isinstance(result, list):
            raise RuntimeError(f"a request failed: {result}")
    return sum(r[0].completion_tokens for r in results) / elapsed


async def measure(task: Any, engine: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"batched": [], "serial": [], "one_batched": [], "one_serial": []}
    many, one = items(args.concurrent, args.tokens), items(1, args.tokens)
    await batched(engine, items(2, 4))  # warm-up of both paths
    serial(task, items(1, 4))
    for _ in range(args.rounds):
        figures["batched"].append(await batched(engine, many))
        figures["serial"].append(serial(task, many))
        figures["one_batched"].append(await batched(engine, one))
        figures["one_serial"].append(serial(task, one))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)

    import torch

    from model_server.engine.generation_engine import attach
    from model_server.tasks.base import LoadOptions
    from model_server.tasks.text_generation import TextGenerationTask

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        task = TextGenerationTask()
        task.load(LoadOptions(path=build_model(Path(tmp)), device="cpu", dtype="float32"))
    engine = attach(
        task, choice="batching", device="cpu", trust_remote_code=False, kv_tokens=None, on_fatal=print
    )
    assert engine is not None
    try:
        figures = asyncio.run(measure(task, engine, args))
    finally:
        engine.close()
    median = {name: statistics.median(values) for name, values in figures.items()}
    load = os.getloadavg()[0]
    print(f"model: Llama 4 layers, hidden 256; {args.threads} torch thread(s); load average {load:.1f}")
    print(
        f"{args.concurrent} concurrent x {args.tokens} tokens: batched {median['batched']:.0f} tokens/s, "
        f"serial {median['serial']:.0f} tokens/s, ratio {median['batched'] / median['serial']:.2f}x"
    )
    alone = median["one_batched"] / median["one_serial"]
    print(
        f"1 request x {args.tokens} tokens: batched {median['one_batched']:.0f} tokens/s, "
        f"generate {median['one_serial']:.0f} tokens/s, ratio {alone:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
