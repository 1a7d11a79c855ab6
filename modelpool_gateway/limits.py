"""Requests and tokens per minute per API key (issue 34 item 1): pure, no I/O, the clock passed in.

A key Secret may set ``requestsPerMinute`` and ``tokensPerMinute`` (``modelpool_contract.gateway_keys``;
parsed in ``keys``).  Each key with a limit has a sliding window of ``LIMIT_WINDOW_SECONDS`` (60 s) per
limit, kept by its digest (the caller ``access`` records): no state for a key without limits, and the
state of a key goes when its last Secret does (``Limiter.forget``, called by the key store), so memory is
bounded by the keys the administrators created.

**The window.** One bucket per second of the clock (the amount charged in it and the time of its latest
charge), at most 61 per window: a bucket leaves the window when its *latest* charge is 60 s old. Counting
a whole bucket at its latest charge errs on the safe side (by under a second), so a window never holds
less than what was charged within the last 60 s:

* **requests**: a request is admitted while fewer than the limit were admitted within the last 60 s, and
  charged at once; so no 60 s ever holds more admitted requests than the limit.
* **tokens** are known only from the answer (its OpenAI ``usage``: prompt + completion), so a request is
  admitted while the tokens charged within the last 60 s are under the limit, and its own tokens are
  charged when its answer has ended. The requests admitted last may take the window past the limit by
  their own tokens; the key then waits until the window is under the limit again.

**Retry-After** of a refusal is computed from the key's own window: the whole seconds until enough of it
has left the window for the request to be admitted (the later of the two windows when both are over):
at least 1, at most 60, and the same request sent then is admitted (if the key sent nothing meanwhile).
Times are integer nanoseconds (``time.monotonic_ns``), so that promise holds exactly.

**Several gateway replicas** do not share a counter: each keeps its own windows and enforces
``limit // replicas`` (at least 1) of each limit (``Limits.share``; ``--replicas``, the chart's
``gateway.replicaCount``). With load spread evenly by the Service that is the key's limit in total; with
uneven load (a client's kept-alive connection stays on one replica) a key is refused earlier than its
limit, never later, except for a limit under the replica count (each replica still admits 1).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final, Literal

from modelpool_contract.gateway_keys import LIMIT_WINDOW_SECONDS

SECOND_NS: Final = 1_000_000_000
WINDOW_NS: Final = LIMIT_WINDOW_SECONDS * SECOND_NS

Reason = Literal["key_rate_limited", "key_token_limited"]


def _lower(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


@dataclass(frozen=True)
class Limits:
    """A key's limits per minute; None: no limit."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def any(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None

    def strictest(self, other: Limits) -> Limits:
        """The lower of each limit: a key held by several Secrets gets the strictest of their limits, so
        a Secret without limits never lifts another's (a tenant's own Secret cannot undo the admin's)."""
        return Limits(
            _lower(self.requests_per_minute, other.requests_per_minute),
            _lower(self.tokens_per_minute, other.tokens_per_minute),
        )

    def share(self, replicas: int) -> Limits:
        """What one of ``replicas`` gateway replicas enforces: ``limit // replicas``, at least 1."""

        def part(limit: int | None) -> int | None:
            return None if limit is None else max(1, limit // max(1, replicas))

        return Limits(part(self.requests_per_minute), part(self.tokens_per_minute))


NO_LIMITS: Final = Limits()


class Window:
    """What was charged within the last ``WINDOW_NS``, by second (see the module docstring)."""

    __slots__ = ("_buckets", "_total")

    def __init__(self) -> None:
        # [second, amount, time of the latest charge], oldest first.
        self._buckets: deque[list[int]] = deque()
        self._total = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def _expire(self, now: int) -> None:
        while self._buckets and now - self._buckets[0][2] >= WINDOW_NS:
            self._total -= self._buckets.popleft()[1]

    def used(self, now: int) -> int:
        self._expire(now)
        return self._total

    def charge(self, amount: int, now: int) -> None:
        if amount <= 0:
            return
        self._expire(now)
        second = now // SECOND_NS
        last = self._buckets[-1] if self._buckets else None
        if last is not None and last[0] >= second:  # never an older bucket: a clock that went back
            last[1] += amount
            last[2] = max(last[2], now)
        else:
            self._buckets.append([second, amount, now])
        self._total += amount

    def wait(self, limit: int, now: int) -> int:
        """Nanoseconds until less than ``limit`` is left in the window (0: it is already)."""
        self._expire(now)
        left = self._total
        for _, amount, last in self._buckets:
            if left < limit:
                break
            left -= amount
            if left < limit:  # this bucket leaving is enough (older ones leave before it)
                return last + WINDOW_NS - now
        return 0


@dataclass(frozen=True)
class Refusal:
    """Why a request is over its key's limit: which limit, the key's whole limit, this replica's share of
    it, and the seconds after which it is admitted."""

    reason: Reason
    limit: int
    share: int
    retry_after: int

    @property
    def unit(self) -> str:
        return "requests" if self.reason == "key_rate_limited" else "tokens"


def retry_seconds(wait_ns: int) -> int:
    """Whole seconds covering ``wait_ns`` (at least 1)."""
    return max(1, -(-wait_ns // SECOND_NS))


# Shares of distinct limits kept at most (``Limiter._share``).
_SHARES_KEPT = 1024


@dataclass
class _KeyWindows:
    requests: Window
    tokens: Window


class Limiter:
    """Every limited key's windows on this replica (``replicas``: how many share the limits)."""

    def __init__(self, replicas: int = 1) -> None:
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self.replicas = replicas
        self._keys: dict[bytes, _KeyWindows] = {}
        # Each key's limits -> this replica's share of them: computed once, not per request.
        self._shares: dict[Limits, Limits] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def _windows(self, key: bytes) -> _KeyWindows:
        found = self._keys.get(key)
        if found is None:
            found = self._keys[key] = _KeyWindows(Window(), Window())
        return found

    def admit(self, key: bytes, limits: Limits, now: int) -> Refusal | None:
        """Admit (and charge) one request of ``key`` at ``now``, or say why not."""
        if not limits.any:
            self._keys.pop(key, None)  # its limits were taken off: nothing to keep
            return None
        share = self._share(limits)
        windows = self._windows(key)
        over: list[tuple[int, Reason, int, int]] = []
        requests, tokens = limits.requests_per_minute, limits.tokens_per_minute
        part = share.requests_per_minute
        if requests is not None and part is not None and (wait := windows.requests.wait(part, now)) > 0:
            over.append((wait, "key_rate_limited", requests, part))
        part = share.tokens_per_minute
        if tokens is not None and part is not None and (wait := windows.tokens.wait(part, now)) > 0:
            over.append((wait, "key_token_limited", tokens, part))
        if over:
            wait, reason, whole, part = max(over)
            return Refusal(reason, whole, part, retry_seconds(wait))
        if share.requests_per_minute is not None:
            windows.requests.charge(1, now)
        return None

    def _share(self, limits: Limits) -> Limits:
        found = self._shares.get(limits)
        if found is None:
            if len(self._shares) >= _SHARES_KEPT:  # limits are the admins' Secrets': few, but bounded
                self._shares.clear()
            found = self._shares[limits] = limits.share(self.replicas)
        return found

    def charge_tokens(self, key: bytes, limits: Limits, tokens: int, now: int) -> None:
        """The tokens an answer of ``key`` reported using, charged when it ended (only for a token limit)."""
        if limits.tokens_per_minute is not None and tokens > 0:
            self._windows(key).tokens.charge(tokens, now)

    def forget(self, key: bytes) -> None:
        """The key's last Secret went: its windows go too."""
        self._keys.pop(key, None)
