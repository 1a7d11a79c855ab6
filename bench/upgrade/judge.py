"""The upgrade check's decisions, pure: what each client request came to, which writes a replica made while
it did not hold the leader election Lease (from the API server's audit events), how long a takeover took,
and which workers still run what the previous release made.

Request outcomes (``outcome``):

* ``answered``: a 2xx;
* ``retryable``: a documented retryable answer, 429 or 503 with ``Retry-After`` (docs/gateway.md: a full
  hold, an expired hold, a gateway shutting down); counted apart, never lost;
* ``hung up``: a rude client's deliberate hang-up (nothing to answer);
* ``not connected``: the connection was refused before a byte was sent (the client picked a gateway pod
  that had just stopped listening: its endpoint list lags, as kube-proxy's does); nothing was sent, so
  nothing was lost, but the count is reported;
* ``lost``: everything else: another status (a 5xx without ``Retry-After``, a 4xx), an error once the
  request was sent, no answer within the deadline plus ``GRACE_S``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bench.soak.clients import Sent
from modelpool_contract.labels import SERVER_CONTAINER
from modelpool_contract.times import parse_time

GRACE_S = 5.0
RETRYABLE_STATUSES = frozenset({429, 503})
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})

ANSWERED = "answered"
RETRYABLE = "retryable"
HUNG_UP = "hung up"
NOT_CONNECTED = "not connected"
LOST = "lost"
OUTCOMES = (ANSWERED, RETRYABLE, HUNG_UP, NOT_CONNECTED, LOST)

Event = Mapping[str, Any]


def outcome(sent: Sent) -> tuple[str, str]:
    """(one of ``OUTCOMES``, why) for an ended request."""
    took = sent.end - sent.start
    if took > sent.deadline + GRACE_S:
        return LOST, f"ended after {took:.1f} s (deadline {sent.deadline:.0f} s)"
    if sent.status is not None:
        if 200 <= sent.status < 300:
            return ANSWERED, str(sent.status)
        if sent.status in RETRYABLE_STATUSES and sent.retry_after:
            return RETRYABLE, f"{sent.status} Retry-After {sent.retry_after}"
        return LOST, f"answered {sent.status} (retry-after {sent.retry_after!r})"
    if sent.hung_up:
        return HUNG_UP, "on purpose"
    if sent.error.startswith("ConnectError"):
        return NOT_CONNECTED, sent.error
    return LOST, sent.error or "no status and no error"


# ---- leader election, from the audit log ---------------------------------------------------------------
def _time(value: object) -> datetime:
    found = parse_time(value)
    if found is None:
        raise ValueError(f"not a time: {value!r}")
    return found


def _when(event: Event) -> datetime:
    return _time(event["requestReceivedTimestamp"])


def _ok(event: Event) -> bool:
    code = (event.get("responseStatus") or {}).get("code")
    return isinstance(code, int) and 200 <= code < 300


CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


def caller(event: Event) -> str:
    """Who made an audited request: the user and the credential (a ServiceAccount token's ``JTI=<id>``), so
    that two replicas running as one ServiceAccount, each with a token of its own, are told apart."""
    user = event.get("user") or {}
    credential = ",".join((user.get("extra") or {}).get(CREDENTIAL_ID) or [])
    return f"{user.get('username', '')}#{credential}"


def is_lease_write(event: Event, lease: str) -> bool:
    ref = event.get("objectRef") or {}
    return event.get("verb") in WRITES and ref.get("resource") == "leases" and ref.get("name") == lease


def acquired_at(events: Iterable[Event], who: str, lease: str, after: datetime) -> datetime | None:
    """When ``who`` (a ``caller``) first wrote the election Lease successfully after ``after`` (its
    take-over: a standby writes the Lease only to take it), or None."""
    times = [
        _when(e)
        for e in events
        if caller(e) == who and is_lease_write(e, lease) and _ok(e) and _when(e) > after
    ]
    return min(times) if times else None


def first_act(events: Iterable[Event], who: str, lease: str, after: datetime) -> datetime | None:
    """When ``who`` (a ``caller``) first wrote anything other than the election Lease, successfully, after
    ``after`` (its first act as the leader), or None."""
    times = [
        _when(e)
        for e in events
        if caller(e) == who
        and e.get("verb") in WRITES
        and not is_lease_write(e, lease)
        and _ok(e)
        and _when(e) > after
    ]
    return min(times) if times else None


def refused(events: Iterable[Event], who: str) -> list[str]:
    """``who``'s requests the API server refused (403: RBAC or an admission policy)."""
    return [
        describe(e) for e in events if caller(e) == who and (e.get("responseStatus") or {}).get("code") == 403
    ]


def describe(event: Event) -> str:
    ref = event.get("objectRef") or {}
    sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
    return f"{event.get('verb')} {ref.get('resource')}{sub} {ref.get('namespace', '')}/{ref.get('name', '')}"


def writes_while_not_leader(
    events: Iterable[Event], who: str, lease: str, held: list[tuple[datetime, datetime]]
) -> list[str]:
    """``who``'s (a ``caller``) writes (the election Lease's excepted: that is how leadership is taken and
    kept) outside every interval in ``held`` (when it held the Lease), as 'at verb resource ns/name'."""
    out = []
    for e in events:
        if caller(e) != who or e.get("verb") not in WRITES or is_lease_write(e, lease):
            continue
        at = _when(e)
        if not any(start <= at <= end for start, end in held):
            out.append(f"{at.isoformat()} {describe(e)}")
    return out


# ---- the workers at the end ----------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerCheck:
    """A worker pod as the upgrade leaves it."""

    name: str
    created: datetime
    image: str


def not_upgraded(workers: Iterable[WorkerCheck], upgraded_at: datetime, server_image: str) -> list[str]:
    """The workers that do not run the new release's server: made before the upgrade (the previous
    operator's pods, never rolled) or with another image than the new release's server image."""
    out = []
    for w in workers:
        if w.created < upgraded_at:
            out.append(f"{w.name}: made by the previous release ({w.created.isoformat()}), not rolled")
        elif w.image != server_image:
            out.append(f"{w.name}: image {w.image}, not {server_image}")
    return out


def worker_check(pod: Mapping[str, Any]) -> WorkerCheck:
    meta, spec = pod["metadata"], pod["spec"]
    containers = spec.get("containers") or []
    image = next((c.get("image", "") for c in containers if c.get("name") == SERVER_CONTAINER), "")
    return WorkerCheck(str(meta["name"]), _time(meta["creationTimestamp"]), str(image))
