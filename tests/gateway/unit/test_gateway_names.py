"""Name resolution: namespace/name, then alias, then pool name; no squatting; ambiguity; the v2 path split."""

from __future__ import annotations

from modelpool_gateway.names import NameIndex, Resolved, Unresolved, split_v2_path
from modelpool_gateway.state import Pool

POOLS = [
    Pool("team-a", "minilm", served_model_name="sentence-transformers/all-MiniLM-L6-v2"),
    Pool("team-a", "bge"),
    Pool("team-b", "bge"),
    Pool("team-b", "llama", served_model_name="minilm"),
]
INDEX = NameIndex.build(POOLS)


def test_a_pool_name_resolves_when_unique() -> None:
    assert INDEX.resolve("llama") == Resolved(("team-b", "llama"))


def test_namespace_slash_name_resolves_exactly() -> None:
    assert INDEX.resolve("team-a/bge") == Resolved(("team-a", "bge"))
    assert INDEX.resolve("team-b/bge") == Resolved(("team-b", "bge"))
    assert isinstance(INDEX.resolve("team-c/bge"), Unresolved)


def test_namespace_slash_name_wins_over_an_alias_of_the_same_spelling() -> None:
    # A pool of team-a (created before the admission policy) calls itself team-b/llama: team-b's pool keeps
    # its full name, and the squatting alias is not indexed, so it takes nothing while team-b/llama is
    # absent either (the prompts meant for team-b never reach team-a).
    squatter = Pool("team-a", "spy", served_model_name="team-b/llama")
    index = NameIndex.build([*POOLS, squatter])
    assert index.resolve("team-b/llama") == Resolved(("team-b", "llama"))
    alone = NameIndex.build([squatter])
    assert isinstance(alone.resolve("team-b/llama"), Unresolved)
    assert alone.resolve("team-a/spy") == Resolved(("team-a", "spy"))
    assert alone.public_name(squatter) == "spy"
    # Its own namespace is fine, and so is an alias that is not shaped like namespace/name.
    own = Pool("team-a", "chat", served_model_name="team-a/llama-3")
    hf = Pool("team-a", "minilm2", served_model_name="meta-llama/Llama-3.1-8B")
    index = NameIndex.build([own, hf])
    assert index.resolve("team-a/llama-3") == Resolved(("team-a", "chat"))
    assert index.resolve("meta-llama/Llama-3.1-8B") == Resolved(("team-a", "minilm2"))


def test_two_pools_claiming_one_alias_are_an_ambiguity_never_a_pick() -> None:
    index = NameIndex.build(
        [Pool("team-a", "x", served_model_name="llama"), Pool("team-b", "y", served_model_name="llama")]
    )
    result = index.resolve("llama")
    assert isinstance(result, Unresolved) and result.ambiguous
    assert "team-a/x" in result.message and "team-b/y" in result.message


def test_an_alias_wins_over_a_pool_name() -> None:
    # team-b/llama's alias "minilm" shadows the pool named minilm in team-a, which stays reachable by
    # namespace/name and its own alias.
    assert INDEX.resolve("minilm") == Resolved(("team-b", "llama"))
    assert INDEX.resolve("team-a/minilm") == Resolved(("team-a", "minilm"))
    assert INDEX.resolve("sentence-transformers/all-MiniLM-L6-v2") == Resolved(("team-a", "minilm"))


def test_a_name_in_two_namespaces_is_ambiguous_and_says_how_to_choose() -> None:
    result = INDEX.resolve("bge")
    assert isinstance(result, Unresolved) and result.ambiguous
    assert "team-a/bge" in result.message and "team-b/bge" in result.message
    assert "namespace/name" in result.message


def test_unknown_and_empty_names() -> None:
    unknown = INDEX.resolve("gpt-4")
    assert isinstance(unknown, Unresolved) and not unknown.ambiguous
    assert "'gpt-4'" in unknown.message and "/v1/models" in unknown.message
    assert isinstance(INDEX.resolve(""), Unresolved)


def test_public_name_is_the_shortest_name_that_resolves_back() -> None:
    names = {p.key: INDEX.public_name(p) for p in POOLS}
    assert names == {
        ("team-a", "minilm"): "sentence-transformers/all-MiniLM-L6-v2",
        ("team-a", "bge"): "team-a/bge",
        ("team-b", "bge"): "team-b/bge",
        ("team-b", "llama"): "minilm",
    }
    for pool in POOLS:
        assert INDEX.resolve(names[pool.key]) == Resolved(pool.key)


def test_v2_paths_with_one_and_two_segment_names() -> None:
    assert split_v2_path(INDEX, "llama/infer") == (Resolved(("team-b", "llama")), "infer")
    assert split_v2_path(INDEX, "llama") == (Resolved(("team-b", "llama")), "")
    assert split_v2_path(INDEX, "team-a/bge/infer") == (Resolved(("team-a", "bge")), "infer")
    assert split_v2_path(INDEX, "team-a/bge") == (Resolved(("team-a", "bge")), "")
    assert split_v2_path(INDEX, "sentence-transformers/all-MiniLM-L6-v2/versions/1/infer") == (
        Resolved(("team-a", "minilm")),
        "versions/1/infer",
    )
    # "llama/ready" is the ready route of llama, not a pool named ready in a namespace named llama.
    assert split_v2_path(INDEX, "llama/ready") == (Resolved(("team-b", "llama")), "ready")
    result, _ = split_v2_path(INDEX, "nope/infer")
    assert isinstance(result, Unresolved)
