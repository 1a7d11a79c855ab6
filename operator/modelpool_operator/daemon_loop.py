"""The one loop of the per-resource daemons (a ModelPool's and a ModelHost's, ``handlers``): a pass in one of
the process's pass slots, a failed pass told once per distinct error, then a wait for the next pass.

Level-based: the pass reads the indices, never an event's diff; events only wake the loop early (its
``wakeup``, poked by the watch handlers). Without them the pass comes again at the resync period, in its
turn (``PassGate.resync_wait``), or sooner when the pass asks for it. What differs between the daemons
is handed in: the pass itself (returning when it wants the next one, if sooner than a resync) and how
to idle until then (a pool refreshes its workers' stats meanwhile).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from modelpool_operator.bookkeeping import Bookkeeping, wait_for_wakeup
from modelpool_operator.effects import kube as kube_api
from modelpool_operator.effects.apply import tell
from modelpool_operator.planner import Event
from modelpool_operator.services import Services

# A failing pass is retried after this long (plus the next event), not in a tight loop.
ERROR_DELAY_S = 5.0
# After a wake-up, wait this long for more events before the pass.
COALESCE_S = 0.3

#: One pass of a daemon: seconds until the next when it wants one sooner than a resync, else None.
OnePass = Callable[[], Awaitable[float | None]]
#: Wait until the daemon is woken (True) or the seconds pass (False).
Idle = Callable[[float], Awaitable[bool]]


async def run_passes(
    services: Services,
    book: Bookkeeping,
    *,
    one_pass: OnePass,
    idle: Idle,
    wakeup: asyncio.Event,
    body: Mapping[str, Any],
    logger: kopf.Logger,
    stopped: kopf.DaemonStopped,
) -> None:
    """Run ``one_pass`` until the daemon is stopped: each in one of the process's pass slots
    (``PassGate``; the slot clears ``wakeup``, so the pokes that come while the daemon waits for it are
    answered by this pass, never by a second one), a failure told on ``body`` (``tell_pass_error``) and
    retried after ``ERROR_DELAY_S``."""
    last_error: str | None = None  # the last failed pass's error, until a pass succeeds
    while not stopped:
        delay = services.config.resync_interval_seconds
        resync = True  # the pass after this one comes at the resync (nothing asked for one sooner)
        try:
            async with book.passes.slot(wakeup):
                sooner = await one_pass()
            if sooner is not None and sooner < delay:
                delay, resync = sooner, False
            last_error = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one bad pass must not kill the daemon; retry shortly
            last_error = tell_pass_error(services, body, logger, exc, last_error)
            delay, resync = ERROR_DELAY_S, False
        woken = await idle(delay)
        if not woken and resync and not stopped:  # a resync waits its turn; an event does not
            turn = book.passes.resync_wait(asyncio.get_running_loop().time())
            if turn > 0:
                woken = await idle(turn)
        if woken:
            # Coalesce a burst of events (a scale-up readies many pods at once) into one pass.
            await asyncio.sleep(COALESCE_S)


def tell_pass_error(
    services: Services, body: Mapping[str, Any], logger: kopf.Logger, exc: Exception, last: str | None
) -> str:
    """A failed pass of a pool's or a ModelHost's daemon: the API server's own message (not the client's
    "(500)\nReason: ..."), with the traceback and a Warning Event ``ReconcileError`` once per distinct
    error, not every few seconds while it lasts (``last``: the previous failed pass's). Returns it."""
    message = kube_api.describe_error(exc)
    if message != last:
        logger.exception("reconciliation failed; retrying in %.0fs", ERROR_DELAY_S)
        tell(services, body, Event("Warning", "ReconcileError", message))
    else:  # info: Kopf posts the object logger's warnings as Events too
        logger.info("reconciliation failed again (%s); retrying", message)
    return message


def idle_on(wakeup: asyncio.Event, stopped: kopf.DaemonStopped) -> Idle:
    """Idle by waiting on ``wakeup`` alone (a ModelHost's daemon: nothing to refresh meanwhile)."""

    async def idle(seconds: float) -> bool:
        return await wait_for_wakeup(wakeup, seconds, stopped.wait())

    return idle
