"""The test kit's one wait: poll a condition until it holds or its deadline passes (``wait_for``; in a
coroutine, ``wait_for_async``), so that no test, benchmark or hack script waits without a bound or on a
bare sleep. The message may be a function, for a failure that should show something only read then (a
process's log)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
Message = str | Callable[[], str]


def _said(message: Message) -> str:
    return message if isinstance(message, str) else message()


class WaitTimeoutError(AssertionError):
    """A condition did not become true before its deadline."""


def _poll(predicate: Callable[[], T | None]) -> tuple[T | None, object]:
    """One look: the predicate's truthy value (else None) and what to report if the deadline passes.
    Exceptions from the predicate count as "not yet" (e.g. the object does not exist yet)."""
    try:
        value = predicate()
    except Exception as err:
        return None, err
    return (value, value) if value else (None, value)


def _timed_out(message: Message, timeout: float, last: object) -> WaitTimeoutError:
    return WaitTimeoutError(f"{_said(message)} (after {timeout:g}s; last value: {last!r})")


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    interval: float = 0.2,
    message: Message = "condition not met",
) -> T:
    """Call ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass (raises
    ``WaitTimeoutError`` naming ``message`` and the last value). Exceptions from the predicate count as "not
    yet" and are reported if the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value, last = _poll(predicate)
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(message, timeout, last)
        time.sleep(interval)


async def wait_for_async(
    predicate: Callable[[], T | None],
    within: float,
    interval: float = 0.02,
    message: Message = "condition not met",
) -> T:
    """``wait_for`` in a coroutine (``within``: its timeout): the event loop runs between the checks."""
    deadline = time.monotonic() + within
    while True:
        value, last = _poll(predicate)
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(message, within, last)
        await asyncio.sleep(interval)


__all__ = ["WaitTimeoutError", "wait_for", "wait_for_async"]
