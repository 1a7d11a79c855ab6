"""LoRA adapters (issue 33, item 3), the parts without a server process: the LRU choice, one adapter name
per token of a packed batch, the masks the shared view carries, ``--adapter``'s parsing, the picker's
LoRA info; and the bank over the tiny Llama in this process (loaded on demand, evicted least recently
used first, 429 when every slot is pinned).  The server process: tests/server/process/test_lora.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_server.adapter_mask import adapter_mask, mask_names
from model_server.config import ConfigError, load_config, parse_adapter
from model_server.engine.adapters import (
    BASE,
    AdapterBank,
    lru_evictions,
    strip_saved_prefix,
    token_names,
)
from model_server.errors import Overloaded
from model_server.metrics import picker_rows
from modelpool_contract import picker
from testkit import tiny_models


def test_a_loaded_adapter_evicts_nothing() -> None:
    assert lru_evictions(["a", "b"], set(), "a", capacity=2) == []


def test_room_left_evicts_nothing() -> None:
    assert lru_evictions(["a"], set(), "b", capacity=2) == []


def test_the_least_recently_used_idle_adapter_goes() -> None:
    assert lru_evictions(["a", "b"], set(), "c", capacity=2) == ["a"]
    assert lru_evictions(["a", "b"], {"a"}, "c", capacity=2) == ["b"]


def test_every_adapter_in_use_leaves_no_room() -> None:
    assert lru_evictions(["a", "b"], {"a", "b"}, "c", capacity=2) is None


@given(
    st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8),
    st.sets(st.sampled_from("abcdefgh")),
    st.sampled_from("abcdefgh"),
    st.integers(1, 8),
)
def test_evictions_keep_the_bound_and_spare_what_runs(
    loaded: list[str], in_use: set[str], want: str, capacity: int
) -> None:
    evict = lru_evictions(loaded, in_use, want, capacity)
    if evict is None:
        return
    assert not set(evict) & in_use and set(evict) <= set(loaded)
    after = [name for name in loaded if name not in evict] + ([] if want in loaded else [want])
    assert len(after) <= max(capacity, len(loaded)) and (want in loaded or len(after) <= capacity)
    # The oldest idle ones, in order.
    idle = [name for name in loaded if name not in in_use]
    assert evict == idle[: len(evict)]


def test_one_name_per_token_of_a_packed_batch() -> None:
    assert token_names(["a", BASE, "b"], [0, 3, 4, 6], 6) == ["a", "a", "a", BASE, "b", "b"]


def test_padding_tokens_are_the_bases() -> None:
    assert token_names(["a"], [0, 2, 2], 4) == ["a", "a", BASE, BASE]


@given(st.lists(st.sampled_from(["x", "y", "z"]), unique=True))
def test_masks_round_trip(names: list[str]) -> None:
    declared = ["z", "y", "x"]
    assert sorted(mask_names(declared, float(adapter_mask(declared, names)))) == sorted(names)


def test_an_unknown_mask_names_nothing() -> None:
    assert mask_names(["a"], float("nan")) == [] and mask_names(["a"], None) == []


def test_a_saved_peft_models_keys_lose_its_prefix() -> None:
    saved = {"base_model.model.model.layers.0.q_proj.lora_A.weight": 1, "other": 2}
    assert strip_saved_prefix(saved) == {"model.layers.0.q_proj.lora_A.weight": 1, "other": 2}


def test_adapter_flags() -> None:
    assert parse_adapter("sql=hf://org/sql-lora") == ("sql", "hf://org/sql-lora")
    args = ["--model", "/m", "--task", "text-generation", "--adapter", "a=/x", "--adapter", "b=pvc://c/b"]
    assert load_config(args).adapters == {"a": "/x", "b": "pvc://c/b"}
    for bad in (["--adapter", "a"], ["--adapter", "a=s3://x"], ["--adapter", "a=/x", "--adapter", "a=/y"]):
        with pytest.raises(ConfigError):
            load_config(["--model", "/m", "--task", "text-generation", *bad])
    with pytest.raises(ConfigError, match="text-generation"):
        load_config(["--model", "/m", "--task", "text-embedding", "--adapter", "a=/x"])


def test_the_pickers_lora_info_names_the_running_adapters() -> None:
    rows = {name: (dict(labels), value) for name, _, labels, value in picker_rows(
        0, 2, None, None, 5.0, lora_running=["sql", "poem"], max_lora=4
    )}  # fmt: skip
    lora = {picker.LORA_RUNNING: "sql,poem", picker.LORA_WAITING: "", picker.LORA_MAX: "4"}
    assert rows[picker.LORA_INFO] == (lora, 5.0)


# ---- the bank over a real model -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bank")
    base = tiny_models.build_llama_generation(root / "llama")
    return {
        "base": base,
        **{n: tiny_models.build_lora_adapter(base, root / n, s) for n, s in (("a", 1), ("b", 2))},
    }


@pytest.fixture
def bank(folders: dict[str, Path]) -> Iterator[tuple[AdapterBank, Any]]:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(folders["base"])
    made = AdapterBank(model.eval(), {"a": str(folders["a"]), "b": str(folders["b"])}, 1, Path)
    yield made, model
    made.close()


def _greedy(model: Any, bank: AdapterBank, adapter: str | None) -> list[int]:
    import torch

    ids = torch.tensor([[3, 17, 42, 9]])
    with bank.applied(adapter), torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    return [int(t) for t in out[0, 4:]]


def test_the_bank_loads_on_demand_and_evicts_the_least_recently_used(bank: tuple[AdapterBank, Any]) -> None:
    adapters, model = bank
    base = _greedy(model, adapters, None)
    assert adapters.loaded == []  # the base needs none
    first = _greedy(model, adapters, "a")
    assert adapters.loaded == ["a"] and first != base
    second = _greedy(model, adapters, "b")
    assert adapters.loaded == ["b"] and second not in (first, base)  # one slot: a went
    assert _greedy(model, adapters, "a") == first and _greedy(model, adapters, None) == base
    assert adapters.running == []


def test_every_slot_pinned_is_429(bank: tuple[AdapterBank, Any]) -> None:
    adapters, _ = bank
    adapters.ensure("a")  # pinned, as a running request pins it
    assert adapters.running == ["a"]
    with pytest.raises(Overloaded, match="--max-adapters"):
        adapters.ensure("b")
    adapters.release("a")
    adapters.ensure("b")
    assert adapters.loaded == ["b"]
    adapters.release("b")
