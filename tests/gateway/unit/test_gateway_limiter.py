"""The per-key limiter (``modelpool_gateway.limits``), pure: properties of its windows over any arrival
times (never more requests than the limit in any 60 s; a token window admits only under its limit; a
refusal's Retry-After is 1 to 60 s and admits then; memory per key bounded), and the multi-replica share."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from modelpool_gateway.limits import (
    SECOND_NS,
    WINDOW_NS,
    Limiter,
    Limits,
    Window,
    retry_seconds,
)

KEY = b"digest-of-a-key"
# Gaps between arrivals: bursts (0), sub-second, and pauses past a whole window.
gaps = st.lists(
    st.one_of(st.just(0), st.integers(1, SECOND_NS), st.integers(1, 3 * WINDOW_NS // 2)), max_size=80
)
limits = st.integers(1, 12)


def arrivals(steps: list[int]) -> list[int]:
    out, now = [], 10**12  # a monotonic clock far from zero
    for gap in steps:
        now += gap
        out.append(now)
    return out


def within(times: list[int], start: int) -> int:
    """How many of ``times`` lie in the 60 s from ``start``."""
    return sum(1 for t in times if start <= t < start + WINDOW_NS)


@given(steps=gaps, limit=limits)
def test_no_60_seconds_ever_hold_more_admitted_requests_than_the_limit(steps: list[int], limit: int) -> None:
    limiter, admitted = Limiter(), []
    for now in arrivals(steps):
        if limiter.admit(KEY, Limits(requests_per_minute=limit), now) is None:
            admitted.append(now)
    # Every 60 s window's count is at its highest when it starts at an admitted request.
    assert all(within(admitted, start) <= limit for start in admitted)


@given(steps=gaps, limit=limits)
def test_a_request_is_refused_only_with_the_limit_admitted_in_the_last_61_seconds(
    steps: list[int], limit: int
) -> None:
    """The window errs on the safe side by under a second (a bucket counted at its latest request)."""
    limiter, admitted = Limiter(), []
    for now in arrivals(steps):
        if limiter.admit(KEY, Limits(requests_per_minute=limit), now) is None:
            admitted.append(now)
        else:
            assert sum(1 for t in admitted if now - t < WINDOW_NS + SECOND_NS) >= limit


@given(steps=gaps, limit=limits, tokens=st.lists(st.integers(0, 9), min_size=80, max_size=80))
def test_a_refusals_retry_after_is_1_to_60_seconds_and_admits_then(
    steps: list[int], limit: int, tokens: list[int]
) -> None:
    limiter = Limiter()
    both = Limits(requests_per_minute=limit, tokens_per_minute=limit * 3)
    for now, used in zip(arrivals(steps), tokens, strict=False):
        refusal = limiter.admit(KEY, both, now)
        if refusal is None:
            limiter.charge_tokens(KEY, both, used, now)
            continue
        assert 1 <= refusal.retry_after <= 60
        assert refusal.limit == refusal.share  # one replica: the whole limit
        later = copy.deepcopy(limiter)
        assert later.admit(KEY, both, now + refusal.retry_after * SECOND_NS) is None
        if refusal.retry_after > 1:  # and not a whole second earlier: it is the key's own window
            sooner = copy.deepcopy(limiter)
            assert sooner.admit(KEY, both, now + (refusal.retry_after - 1) * SECOND_NS) is not None


@given(
    steps=gaps,
    limit=st.integers(1, 40),
    charges=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 5 * SECOND_NS)), min_size=80, max_size=80),
)
def test_tokens_admit_a_request_only_while_the_last_minutes_tokens_are_under_the_limit(
    steps: list[int], limit: int, charges: list[tuple[int, int]]
) -> None:
    """Tokens are charged when the answer ends (``after`` the admission); a request is admitted only while
    the tokens charged within the last 60 s are under the limit."""
    limiter = Limiter()
    key_limits = Limits(tokens_per_minute=limit)
    charged: list[tuple[int, int]] = []  # (time, tokens)
    pending: list[tuple[int, int]] = []  # answers still running: (end, tokens)
    for now, (used, after) in zip(arrivals(steps), charges, strict=False):
        for end, tokens in sorted(p for p in pending if p[0] <= now):
            limiter.charge_tokens(KEY, key_limits, tokens, end)
            charged.append((end, tokens))
        pending = [p for p in pending if p[0] > now]
        recent = sum(tokens for t, tokens in charged if now - t < WINDOW_NS)
        refusal = limiter.admit(KEY, key_limits, now)
        if refusal is None:
            assert recent < limit
            pending.append((now + after, used))
        else:
            assert refusal.reason == "key_token_limited" and 1 <= refusal.retry_after <= 60


@given(steps=gaps, amounts=st.lists(st.integers(0, 1000), min_size=80, max_size=80))
def test_a_window_keeps_at_most_61_buckets_and_exactly_the_last_minutes_charges_within_a_second(
    steps: list[int], amounts: list[int]
) -> None:
    window, charged = Window(), []
    for now, amount in zip(arrivals(steps), amounts, strict=False):
        window.charge(amount, now)
        charged.append((now, amount))
        assert len(window) <= 61
        exact = sum(a for t, a in charged if now - t < WINDOW_NS)
        loose = sum(a for t, a in charged if now - t < WINDOW_NS + SECOND_NS)
        assert exact <= window.used(now) <= loose


def test_limits_are_per_key_and_a_key_without_limits_keeps_nothing() -> None:
    limiter, now = Limiter(), 10**12
    one = Limits(requests_per_minute=1)
    assert limiter.admit(b"a", one, now) is None
    refused = limiter.admit(b"a", one, now + 1)
    assert refused is not None and refused.reason == "key_rate_limited" and refused.retry_after == 60
    assert limiter.admit(b"b", one, now + 1) is None  # another key: a window of its own
    assert limiter.admit(b"c", Limits(), now) is None and len(limiter) == 2
    limiter.forget(b"a")
    assert limiter.admit(b"a", one, now + 2) is None  # its Secret went and came back: a fresh window
    assert limiter.admit(b"b", Limits(), now + 3) is None and len(limiter) == 1  # limits taken off


def test_the_later_window_decides_the_retry_after_when_both_limits_are_over() -> None:
    limiter, now = Limiter(), 10**12
    both = Limits(requests_per_minute=2, tokens_per_minute=10)
    assert limiter.admit(KEY, both, now) is None
    limiter.charge_tokens(KEY, both, 50, now + 30 * SECOND_NS)  # a long answer, charged as it ended
    assert limiter.admit(KEY, both, now + 30 * SECOND_NS) is not None
    refusal = limiter.admit(KEY, both, now + 31 * SECOND_NS)
    assert refusal is not None and refusal.reason == "key_token_limited" and refusal.retry_after == 59


def test_each_replica_enforces_its_share_at_least_one() -> None:
    assert Limits(10, 100).share(1) == Limits(10, 100)
    assert Limits(10, 100).share(3) == Limits(3, 33)
    assert Limits(1, None).share(4) == Limits(1, None)
    limiter, now = Limiter(replicas=2), 10**12
    key_limits = Limits(requests_per_minute=5)
    assert [limiter.admit(KEY, key_limits, now + i) is None for i in range(3)] == [True, True, False]
    refusal = limiter.admit(KEY, key_limits, now + 3)
    assert refusal is not None and (refusal.limit, refusal.share) == (5, 2)


def test_retry_seconds_round_up_to_a_whole_second_at_least_one() -> None:
    assert [retry_seconds(n) for n in (1, SECOND_NS, SECOND_NS + 1, WINDOW_NS)] == [1, 1, 2, 60]


def test_the_strictest_of_several_secrets_limits_holds() -> None:
    assert Limits(10, None).strictest(Limits(None, 5)) == Limits(10, 5)
    assert Limits(10, 7).strictest(Limits(3, None)) == Limits(3, 7)
    assert Limits().strictest(Limits()) == Limits()
