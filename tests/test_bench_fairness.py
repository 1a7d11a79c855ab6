"""The pure part of ``bench.fairness``'s limits figure: the most admitted within any 60 s window."""

from __future__ import annotations

from bench.fairness import limit_figures


def test_the_most_in_any_window_counts_a_sliding_window_not_the_first_one() -> None:
    run = {"admitted_at": [0.1, 0.2, 30.0, 59.9, 60.15, 61.0, 69.0], "retry_after": [5, 60, 1], "other": {}}
    figures = limit_figures(run, 4)
    assert figures["first_window"] == 4
    assert figures["most_in_any_window"] == 5  # (9, 69] holds 30, 59.9, 60.15, 61, 69
    assert figures["retry_after_range"] == (1, 60)


def test_a_429_without_retry_after_is_reported() -> None:
    run = {"admitted_at": [], "retry_after": [3, -1], "other": {500: 1}}
    figures = limit_figures(run, 10)
    assert figures["retry_after_range"] is None
    assert figures["most_in_any_window"] == 0 and figures["other"] == {500: 1}
