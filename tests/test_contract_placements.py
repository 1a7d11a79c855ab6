"""The host pod's placement annotation: the operator writes it, a gateway reads it back."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from modelpool_contract.placements import (
    ANNOTATION_MODELS,
    host_model_name,
    models_annotation,
    read_models,
)
from modelpool_contract.states import WORKER_STATES

pools = st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True), st.sampled_from(WORKER_STATES)
)


@given(pools)
def test_round_trip(models: dict[str, str]) -> None:
    written = models_annotation(models)  # type: ignore[arg-type]
    assert read_models({ANNOTATION_MODELS: written}) == models
    assert (
        models_annotation(read_models({ANNOTATION_MODELS: written})) == written
    )  # stable: no spurious writes


@given(st.text(max_size=200))
def test_never_raises(raw: str) -> None:
    read_models({ANNOTATION_MODELS: raw})


def test_unreadable_or_unknown_places_nothing() -> None:
    assert read_models(None) == {}
    assert read_models({ANNOTATION_MODELS: "["}) == {}
    assert read_models({ANNOTATION_MODELS: "[1, 2]"}) == {}
    assert read_models({ANNOTATION_MODELS: json.dumps({"a": "Asleep", "b": 3, "c": "Idle"})}) == {"c": "Idle"}


def test_a_host_state_is_read() -> None:
    """Sleeping and Waking are states of a model on a host: a gateway routes by them."""
    written = json.dumps({"a": "Sleeping", "b": "Waking"})
    assert read_models({ANNOTATION_MODELS: written}) == {"a": "Sleeping", "b": "Waking"}


def test_host_model_name_is_the_pools_name() -> None:
    """A served name may hold a "/" (SERVED_NAME_PATTERN), which a v2 URL's model segment cannot carry."""
    assert host_model_name("minilm") == "minilm"
