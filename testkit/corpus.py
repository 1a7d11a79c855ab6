"""The benchmark's sentences: deterministic, of varied lengths, like real traffic."""

from __future__ import annotations

import random

WORDS = (  # noqa: SIM905 - a readable word list
    "a man is eating food bread riding horse the quick brown fox jumps over lazy dog weather in "
    "mountains winter summer city river model server queue batch request latency throughput memory "
    "budget worker kubernetes operator cluster node pod gpu embedding sentence text image vision "
    "generation network people walk talk read write small large fast slow good bad new old first "
    "last long short high low"
).split()


def corpus(n: int, seed: int = 0) -> list[str]:
    """Deterministic sentences of 4..40 words (varied lengths, like real traffic)."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))).capitalize() + "." for _ in range(n)
    ]
