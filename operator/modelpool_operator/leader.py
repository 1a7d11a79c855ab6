"""Leader election on a ``coordination.k8s.io`` Lease: one acting operator, fenced.

client-go's rules (``tools/leaderelection``), which controller-runtime uses too:

* a candidate takes the Lease when it does not exist (create), when its holder released it (empty
  ``holderIdentity``), or when the record it last *observed* has not changed for ``leaseDurationSeconds``
  by its own clock (never by comparing ``renewTime`` with its clock: clocks differ between nodes);
* the holder renews it every ``retry_period`` (an update with the Lease's ``resourceVersion``: two
  candidates never both win, the API server answers the loser 409);
* **fencing**: a holder whose last successful renewal *started* more than ``renew_deadline`` ago stops
  acting: the process exits non-zero at once (``os._exit``, no teardown that could write), and the kubelet
  restarts it as a candidate (client-go's ``OnStoppedLeading`` -> ``os.Exit``). ``renew_deadline <
  lease_duration``: the holder has stopped before any other candidate's observation of the same renewal
  can expire. The deadline is checked both by the renewal loop and by the event loop itself at every
  iteration before any callback runs (``FencedEventLoop``), so that a process that was paused (SIGSTOP, a
  frozen node, a long GC) cannot send one more write when it resumes: it exits first.
* on a clean stop (SIGTERM) the holder releases the Lease (``holderIdentity`` cleared,
  ``leaseDurationSeconds`` 1): a standby takes it at its next try instead of after the lease duration.

The decisions are pure (``observe``, ``decide``, ``acquired_record``, ``released_record``, ``fenced``);
``LeaderElector`` is the thin wiring on kubernetes_asyncio's ``CoordinationV1Api``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Final

logger = logging.getLogger(__name__)

#: The exit code of a leader that lost its Lease (or could not renew it in time): the kubelet restarts it.
EXIT_LOST_LEASE = 9


#: The default durations (seconds). client-go's rules with shorter durations than controller-runtime's
#: 15/10/2: a killed leader is replaced within lease + retry (about 14 s measured, under the 15 s day-two
#: target), and a request sent before the renew deadline still has lease - renew (4 s) to reach the API
#: server before a standby may act.
DEFAULT_LEASE_DURATION_S: Final = 12.0
DEFAULT_RENEW_DEADLINE_S: Final = 8.0
DEFAULT_RETRY_PERIOD_S: Final = 2.0


@dataclass(frozen=True)
class Timing:
    """client-go's three durations (seconds)."""

    lease_duration: float = DEFAULT_LEASE_DURATION_S
    renew_deadline: float = DEFAULT_RENEW_DEADLINE_S
    retry_period: float = DEFAULT_RETRY_PERIOD_S

    def __post_init__(self) -> None:
        problems = check_timing(self.lease_duration, self.renew_deadline, self.retry_period)
        if problems:
            raise ValueError(problems)


def check_timing(lease_duration: float, renew_deadline: float, retry_period: float) -> str | None:
    """Why these durations cannot fence a leader (None: they can)."""
    if min(lease_duration, renew_deadline, retry_period) <= 0:
        return "leader election durations must be positive"
    if not renew_deadline < lease_duration:
        return (
            f"leader election renew deadline ({renew_deadline:g} s) must be shorter than the lease duration "
            f"({lease_duration:g} s): a leader must stop acting before its lease can be taken"
        )
    if not retry_period < renew_deadline:
        return (
            f"leader election retry period ({retry_period:g} s) must be shorter than the renew deadline "
            f"({renew_deadline:g} s): a leader must get at least one more try before it gives up"
        )
    return None


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec as leader election reads it (``holder`` empty: released or never held)."""

    holder: str = ""
    lease_duration_s: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: Any) -> LeaseRecord:
        """From a ``V1LeaseSpec`` (or a dict with the wire's camelCase names)."""
        get: Callable[[str, str], Any]
        if isinstance(spec, dict):
            get = lambda snake, camel: spec.get(camel)  # noqa: E731
        else:
            get = lambda snake, camel: getattr(spec, snake, None)  # noqa: E731
        return cls(
            holder=get("holder_identity", "holderIdentity") or "",
            lease_duration_s=int(get("lease_duration_seconds", "leaseDurationSeconds") or 0),
            acquire_time=_stamp(get("acquire_time", "acquireTime")),
            renew_time=_stamp(get("renew_time", "renewTime")),
            transitions=int(get("lease_transitions", "leaseTransitions") or 0),
        )


def _stamp(value: Any) -> str | None:
    if value is None:
        return None
    return micro_time(value) if isinstance(value, datetime) else str(value)


def micro_time(when: datetime) -> str:
    """A Lease's MicroTime on the wire (RFC 3339 with microseconds, UTC)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Observation:
    """A Lease record as this candidate last saw it change, and when (its own monotonic clock)."""

    record: LeaseRecord
    observed_at: float


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """Pure: the observation after reading ``record`` at ``now``: the time is kept while the record is
    unchanged (a holder that stopped renewing expires ``lease_duration_s`` after its last change was seen)."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


class Action(Enum):
    CREATE = "create"  # no Lease: create it, held by me
    ACQUIRE = "acquire"  # released or expired: take it over
    RENEW = "renew"  # mine: renew it
    WAIT = "wait"  # held by another, not expired


def decide(identity: str, observation: Observation | None, now: float) -> Action:
    """Pure: what a candidate named ``identity`` may do about the Lease (None: it does not exist) at
    ``now`` (the same monotonic clock as ``observation.observed_at``)."""
    if observation is None:
        return Action.CREATE
    record = observation.record
    if record.holder == identity:
        return Action.RENEW
    if not record.holder:
        return Action.ACQUIRE
    if now < observation.observed_at + record.lease_duration_s:
        return Action.WAIT
    return Action.ACQUIRE


def acquired_record(
    identity: str, current: LeaseRecord | None, action: Action, lease_duration: float, wall: datetime
) -> LeaseRecord:
    """Pure: the record to write for ``action`` (never WAIT) at wall-clock time ``wall``: a renewal keeps
    the acquire time and the transitions; a takeover counts one more transition."""
    if action is Action.WAIT:
        raise ValueError("nothing to write while another candidate holds the lease")
    stamp = micro_time(wall)
    duration = max(1, round(lease_duration))
    if action is Action.RENEW and current is not None:
        return replace(current, lease_duration_s=duration, renew_time=stamp)
    transitions = 0 if current is None else current.transitions + (1 if current.holder != identity else 0)
    return LeaseRecord(
        holder=identity,
        lease_duration_s=duration,
        acquire_time=stamp,
        renew_time=stamp,
        transitions=transitions,
    )


def released_record(current: LeaseRecord, wall: datetime) -> LeaseRecord:
    """Pure: the record a holder writes when it stops cleanly (client-go's ``ReleaseOnCancel``)."""
    return replace(current, holder="", lease_duration_s=1, renew_time=micro_time(wall))


def fenced(renewed_at: float | None, now: float, renew_deadline: float) -> bool:
    """Pure: whether a holder whose last successful renewal started at ``renewed_at`` (None: never held)
    must stop acting at ``now``."""
    return renewed_at is not None and now - renewed_at >= renew_deadline


def default_identity(environ: dict[str, str] | None = None) -> str:
    """The candidate's name: the pod's (``POD_NAME``, the downward API), else host name and process id."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


# ---- the fence inside the event loop ---------------------------------------------------------------------


class Fence:
    """The holder's deadline: ``renewed(t)`` after each successful renewal started at ``t``; ``check()``
    exits the process once the deadline has passed. Shared by the renewal loop and the event loop."""

    def __init__(self, renew_deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.renew_deadline = renew_deadline
        self.renewed_at: float | None = None
        self._clock = clock

    def renewed(self, started: float) -> None:
        self.renewed_at = started

    def expired(self) -> bool:
        return fenced(self.renewed_at, self._clock(), self.renew_deadline)

    def check(self) -> None:
        if self.expired():
            lost(f"the lease was not renewed within the renew deadline ({self.renew_deadline:g} s)")


def lost(reason: str) -> None:
    """Stop acting now: no teardown (Kopf's shutdown, the daemons' ``finally``) may write once the lease
    can be someone else's."""
    logger.critical("leader election: %s; exiting (%d) to restart as a candidate", reason, EXIT_LOST_LEASE)
    logging.shutdown()
    os._exit(EXIT_LOST_LEASE)


class FencedEventLoop(asyncio.SelectorEventLoop):
    """An event loop that checks the fence after every wait for I/O and before running any callback: a
    paused holder that resumes past its deadline exits before it can send anything."""

    fence: Fence | None = None

    def _process_events(self, event_list: list[tuple[selectors.SelectorKey, int]]) -> None:
        if self.fence is not None:
            self.fence.check()
        super()._process_events(event_list)  # type: ignore[misc]


# ---- the wiring -----------------------------------------------------------------------------------------


class LeaderElector:
    """Acquires, renews and releases one Lease through kubernetes_asyncio's ``CoordinationV1Api``."""

    def __init__(
        self,
        api: Any,
        *,
        name: str,
        namespace: str,
        identity: str,
        timing: Timing,
        fence: Fence,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self.name, self.namespace, self.identity = name, namespace, identity
        self.timing = timing
        self.fence = fence
        self._clock = clock
        self._observed: Observation | None = None
        self._body: Any = None

    async def try_acquire_or_renew(self) -> bool:
        """One try (client-go's ``tryAcquireOrRenew``): True when this candidate holds the Lease now."""
        from kubernetes_asyncio.client.exceptions import ApiException

        started = self._clock()
        timeout = self.timing.renew_deadline
        try:
            lease = await self._api.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            lease = None
        now_wall = datetime.now(UTC)
        if lease is None:
            self._observed = None
        else:
            record = LeaseRecord.from_spec(lease.spec)
            self._observed = observe(self._observed, record, self._clock())
        action = decide(self.identity, self._observed, self._clock())
        if action is Action.WAIT:
            return False
        current = None if self._observed is None else self._observed.record
        record = acquired_record(self.identity, current, action, self.timing.lease_duration, now_wall)
        body = self._lease_body(record, lease)
        try:
            if action is Action.CREATE:
                written = await self._api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=timeout
                )
            else:
                written = await self._api.replace_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=timeout
                )
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first (or already exists): not ours
                return False
            raise
        self._observed = Observation(LeaseRecord.from_spec(written.spec), self._clock())
        self._body = written
        self.fence.renewed(started)
        if action is not Action.RENEW:
            logger.info(
                "leader election: %s acquired lease %s/%s (%s)", self.identity, self.namespace, self.name,
                action.value,
            )  # fmt: skip
        return True

    def _lease_body(self, record: LeaseRecord, lease: Any) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            # Optimistic concurrency: the update fails (409) when the Lease changed since it was read.
            metadata["resourceVersion"] = lease.metadata.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": _spec_wire(record),
        }

    def holder(self) -> str:
        """The holder as last observed ("" when none)."""
        return "" if self._observed is None else self._observed.record.holder

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Try every ``retry_period`` until this candidate holds the Lease (True) or ``stop`` is set."""
        announced = None
        while not stop.is_set():
            try:
                if await self.try_acquire_or_renew():
                    return True
            except Exception as exc:  # the API unreachable: keep trying, as a candidate nothing is at stake
                logger.warning("leader election: acquiring the lease failed: %s", exc)
            holder = self.holder()
            if holder and holder != announced:
                logger.info("leader election: %s is the leader; %s stands by", holder, self.identity)
                announced = holder
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.timing.retry_period)
        return False

    async def keep_renewing(self) -> None:
        """Renew every ``retry_period`` while holding; exit the process when the Lease is another's or the
        renew deadline passes without a successful renewal (never returns otherwise)."""
        while True:
            await asyncio.sleep(self.timing.retry_period)
            self.fence.check()
            try:
                held = await asyncio.wait_for(self.try_acquire_or_renew(), self._time_left())
            except Exception as exc:
                logger.warning("leader election: renewing the lease failed: %s", exc)
                self.fence.check()
                continue
            if not held:
                lost(f"the lease is held by {self.holder() or 'another candidate'}")

    def _time_left(self) -> float:
        renewed = self.fence.renewed_at
        left = self.timing.renew_deadline - (self._clock() - renewed) if renewed is not None else 0
        return max(left, 0.001)

    async def release(self) -> None:
        """Give the Lease up (a clean stop): a standby takes it at its next try."""
        if self._body is None or self.fence.expired():
            return
        record = released_record(LeaseRecord.from_spec(self._body.spec), datetime.now(UTC))
        body = self._lease_body(record, self._body)
        try:
            await self._api.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self.timing.retry_period
            )
            logger.info("leader election: %s released lease %s/%s", self.identity, self.namespace, self.name)
        except Exception as exc:  # it expires by itself
            logger.warning("leader election: releasing the lease failed: %s", exc)


def _spec_wire(record: LeaseRecord) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "holderIdentity": record.holder or None,
        "leaseDurationSeconds": record.lease_duration_s,
        "leaseTransitions": record.transitions,
    }
    if record.acquire_time:
        spec["acquireTime"] = record.acquire_time
    if record.renew_time:
        spec["renewTime"] = record.renew_time
    return spec


async def serve_standby_liveness(port: int, elector: LeaderElector) -> Callable[[], Awaitable[None]]:
    """``GET /healthz`` on ``port`` while standing by (the kubelet's liveness probe would otherwise kill a
    standby, whose Kopf, which serves the endpoint, has not started): 200 and who leads. Returns the
    coroutine function that stops it (before Kopf serves the same port)."""
    from aiohttp import web

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"standby": elector.identity, "leader": elector.holder()})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner.cleanup


async def lead(
    elector: LeaderElector,
    work: Callable[[], Awaitable[None]],
    *,
    on_leading: Callable[[bool], None] = lambda leading: None,
    liveness_port: int = 0,
) -> int:
    """Stand by until ``elector`` holds its Lease, then run ``work`` (the operator) while renewing; a
    SIGTERM or SIGINT while standing by ends the wait (exit 0). ``work`` handles the signals itself once it
    runs (Kopf does); when it returns, the Lease is released. Losing the Lease exits the process
    (``lost``). ``liveness_port``: answer the liveness probe while standing by. Returns the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    on_leading(False)
    logger.info(
        "leader election: %s is a candidate for lease %s/%s", elector.identity, elector.namespace,
        elector.name,
    )  # fmt: skip
    stop_liveness = await serve_standby_liveness(liveness_port, elector) if liveness_port else None
    try:
        acquired = await elector.acquire(stop)
    finally:
        if stop_liveness is not None:
            await stop_liveness()
    if not acquired:
        logger.info("leader election: stopped while standing by")
        return 0
    on_leading(True)
    renewing = asyncio.create_task(elector.keep_renewing(), name="lease renewal")
    try:
        await work()
    finally:
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        on_leading(False)
        await elector.release()
    return 0
