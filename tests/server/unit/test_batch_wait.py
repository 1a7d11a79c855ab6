"""The batcher's wait for more requests (``engine.batch_wait``): it ends once the sweep holds as many
requests as the last one did and none is on its way, at a full batch, or (the caller) at the delay."""

from __future__ import annotations

import pytest

from model_server.engine.batch_wait import keep_waiting


@pytest.mark.parametrize(
    ("requests", "items", "expected", "on_the_way", "waits"),
    [
        (1, 1, 8, 0, True),  # the last sweep's clients are still coming back
        (7, 7, 8, 0, True),
        (8, 8, 8, 0, False),  # every client of the last sweep is here: dispatch at once
        (9, 9, 8, 0, False),  # more than last time (a new client)
        (8, 8, 8, 1, True),  # one more admitted and on its way: it arrives in microseconds
        (2, 2, 0, 0, False),  # nothing to expect (the caller waits only after a concurrent sweep)
        (3, 32, 8, 2, False),  # a full batch never waits
        (1, 40, 8, 0, False),
    ],
)
def test_when_the_batcher_waits_for_more(
    requests: int, items: int, expected: int, on_the_way: int, waits: bool
) -> None:
    assert (
        keep_waiting(requests=requests, items=items, expected=expected, on_the_way=on_the_way, limit=32)
        is waits
    )
