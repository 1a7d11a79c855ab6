"""LoRA adapters per request (issue 33, item 3) on a real ``modelpool-server``: a tiny Llama on the
continuous-batching engine with two tiny random adapters (``testkit.tiny_models.build_lora_adapter``)
that a local hub serves as ``hf://`` sources (tests/hub.py), loaded on their first request.

Requests for both adapters and the base, streamed at once so that they run in the same batches, each get
their own answer: greedy token ids equal to peft's own ``PeftModel.generate`` of that adapter alone
(computed here, apart from the server), and the base model's unchanged.  ``/v1/models`` lists the adapters
with their parent, ``/stats`` the loaded ones, and a third adapter beyond ``--max-adapters`` evicts the least
recently used one.  The pure parts: tests/server/unit/test_adapters.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testkit import tiny_models
from testkit.server import ServerProcess, launch
from tests.hub import LocalHub

pytestmark = pytest.mark.slow

CONTEXT = 1024
# Long enough that the three streams overlap for certain: none of the answers ends early (no end of sequence
# within it, checked below), and each takes many iterations.
MAX_TOKENS = 128
PROMPT = "Once upon a time there was a tiny model"
ADAPTERS = {"sql": 1, "poem": 2, "tale": 3}  # name -> the seed of its random weights


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    base = tiny_models.build_llama_generation(root / "llama", context=CONTEXT)
    made = {name: tiny_models.build_lora_adapter(base, root / name, seed) for name, seed in ADAPTERS.items()}
    return {"base": base, **made}


@pytest.fixture(scope="module")
def server(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repos = {f"loras/{name}": folders[name] for name in ADAPTERS}
    with LocalHub(repos) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path_factory.mktemp("hf")), "HF_HUB_OFFLINE": "0"}
        adapters = [arg for name in ADAPTERS for arg in ("--adapter", f"{name}=hf://loras/{name}")]
        args = ["--model", str(folders["base"]), "--task", "text-generation", "--device", "cpu"]
        args += ["--name", "tiny", "--generation-engine", "batching", "--max-adapters", "2", *adapters]
        proc = launch(args, env=env, probe=True)
        try:
            proc.wait("/v2/health/ready", timeout=180)
            yield proc
        finally:
            proc.stop()


def reference(folders: dict[str, Path], adapter: str | None) -> list[int]:
    """peft's own greedy tokens of ``PROMPT`` for ``adapter`` (None: the base), in this process."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders["base"])
    loaded: Any = AutoModelForCausalLM.from_pretrained(folders["base"])
    model: Any = loaded.eval()
    if adapter is not None:
        peft_model: Any = PeftModel.from_pretrained(model, folders[adapter])
        model = peft_model.eval()
    ids = tokenizer(PROMPT, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(
            **ids, max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    return [int(t) for t in out[0, ids["input_ids"].shape[-1] :]]


def decoded(folders: dict[str, Path], ids: list[int]) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders["base"])
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def complete(server: ServerProcess, model: str) -> tuple[str, int]:
    r = client(server).completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert r.model == model and r.usage is not None
    return r.choices[0].text, r.usage.completion_tokens


def stream_together(server: ServerProcess, models: list[str]) -> dict[str, tuple[str, float, float]]:
    """Stream one completion per model, all started at once: each one's text and the times of its first
    and last piece."""
    barrier = threading.Barrier(len(models))
    out: dict[str, tuple[str, float, float]] = {}

    def one(model: str) -> None:
        import time

        barrier.wait()
        stream = client(server).completions.create(
            model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        pieces, times = [], []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                pieces.append(chunk.choices[0].text)
                times.append(time.monotonic())
        out[model] = ("".join(pieces), times[0], times[-1])

    threads = [threading.Thread(target=one, args=(m,)) for m in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return out


def test_two_adapters_and_the_base_in_one_batch_each_get_their_own_answer(
    server: ServerProcess, folders: dict[str, Path]
) -> None:
    expected = {
        model: reference(folders, adapter)
        for model, adapter in (("tiny", None), ("sql", "sql"), ("poem", "poem"))
    }
    assert {len(ids) for ids in expected.values()} == {MAX_TOKENS}
    texts = {model: decoded(folders, ids) for model, ids in expected.items()}
    assert len(set(texts.values())) == 3  # the adapters change the answer
    alone = {model: complete(server, model) for model in expected}
    assert alone == {model: (texts[model], len(ids)) for model, ids in expected.items()}
    together = stream_together(server, list(expected))
    assert {model: text for model, (text, _, _) in together.items()} == texts
    # They ran at once: every stream's first piece came before every other stream's last one.
    starts, ends = [s for _, s, _ in together.values()], [e for _, _, e in together.values()]
    assert max(starts) < min(ends)


def test_v1_models_lists_the_adapters_with_their_parent(server: ServerProcess) -> None:
    models = httpx.get(server.url + "/v1/models", timeout=5).json()["data"]
    assert [(m["id"], m.get("parent")) for m in models] == [
        ("tiny", None), ("sql", "tiny"), ("poem", "tiny"), ("tale", "tiny"),
    ]  # fmt: skip


def test_a_third_adapter_evicts_the_least_recently_used(
    server: ServerProcess, folders: dict[str, Path]
) -> None:
    complete(server, "sql")
    complete(server, "poem")  # sql is now the least recently used of the two slots
    assert complete(server, "tale")[0] == decoded(folders, reference(folders, "tale"))
    stats = httpx.get(server.url + "/stats", timeout=5).json()
    assert sorted(stats["generation"]["adapters"]) == ["poem", "tale"]
    assert complete(server, "sql")[0] == decoded(folders, reference(folders, "sql"))  # loaded again


def test_an_unknown_model_is_404(server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        complete(server, "nope")
