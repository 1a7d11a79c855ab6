"""API keys from labelled Secrets: what each key grants (pure) and the in-memory store the watch keeps.

A key Secret (``modelpool_contract.gateway_keys``) is turned into a ``Grant`` by ``parse_grant``: the
namespaces whose every pool it grants and single pools.  The rule that keeps tenants apart: a Secret
outside the gateway's own (admin) namespace grants pools of its own namespace only; one that names
anything else is refused whole (a warning names the Secret, never the key).  Only Secrets in the admin
namespace may grant other namespaces, or every namespace (``*``).  The admin namespace is one of its own
(``--keys-namespace``, by default ``<release namespace>-keys``: ``gateway_keys.default_keys_namespace``),
never the release namespace, whose other Secrets (the operator's control seed, Helm's releases) the
gateway must not be able to list.

A key Secret may also limit its key: ``requestsPerMinute`` and ``tokensPerMinute`` (``parse_limits``:
positive integers; anything else refuses the Secret whole, logged like the other fields), enforced by
``limits.Limiter``. A key held by several Secrets gets the strictest of their limits
(``Limits.strictest``), so a Secret without limits never lifts another's.  Its ``weight`` (1 to
``MAX_WEIGHT``) and ``priority`` (0 to ``MAX_PRIORITY``) are read the same way (``parse_share``; the
lowest of several Secrets'), for ``fairness`` and ``hold``; above the defaults (1, 0) only in a Secret of
the admin namespace: a tenant's own key Secret (``--tenant-keys``) that sets more is refused whole.

The store keeps no key, only its SHA-256 digest: a request's bearer token is hashed and looked up by
digest, so neither a log, a heap dump nor the lookup's timing shows a key (the dictionary is searched by
a digest an attacker cannot steer).  Several Secrets may carry the same key: it grants the union of
theirs, and deleting one Secret withdraws only its part.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes_asyncio import client

from modelpool_contract.gateway_keys import (
    ALL_NAMESPACES,
    KEY_FIELD,
    KEY_SELECTOR,
    MAX_PER_MINUTE,
    MAX_PRIORITY,
    MAX_WEIGHT,
    MIN_KEY_LENGTH,
    NAMESPACES_FIELD,
    POOLS_FIELD,
    PRIORITY_FIELD,
    REQUESTS_PER_MINUTE_FIELD,
    TOKENS_PER_MINUTE_FIELD,
    WEIGHT_FIELD,
)
from modelpool_gateway.fairness import EQUAL_SHARE, Share
from modelpool_gateway.limits import NO_LIMITS, Limits
from modelpool_gateway.state import Key
from modelpool_gateway.watch import WatchSpec

log = logging.getLogger("modelpool.gateway.keys")

JSON = dict[str, Any]


@dataclass(frozen=True)
class Grant:
    """The pools a key may use: every pool of ``namespaces`` (``*``: of every namespace) and ``pools``."""

    namespaces: frozenset[str] = frozenset()
    pools: frozenset[Key] = frozenset()

    @property
    def everything(self) -> bool:
        return ALL_NAMESPACES in self.namespaces

    def allows(self, pool: Key) -> bool:
        return self.everything or pool[0] in self.namespaces or pool in self.pools

    def union(self, other: Grant) -> Grant:
        return Grant(self.namespaces | other.namespaces, self.pools | other.pools)


#: What ``--auth none`` grants every caller.
EVERYTHING = Grant(namespaces=frozenset({ALL_NAMESPACES}))


# ---- decisions (pure) ---------------------------------------------------------------------------------


def _items(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _pool_key(entry: str, own_namespace: str) -> Key | None:
    namespace, slash, name = entry.rpartition("/")
    if not name or (slash and not namespace) or "/" in namespace:
        return None
    return (namespace or own_namespace, name)


def parse_grant(
    namespace: str, admin_namespace: str, namespaces: str | None, pools: str | None
) -> Grant | str:
    """The grant of a key Secret in ``namespace`` with these ``namespaces``/``pools`` fields, or why it
    is refused (see the module docstring)."""
    listed = _items(namespaces)
    keys: list[Key] = []
    for entry in _items(pools):
        key = _pool_key(entry, namespace)
        if key is None:
            return f"{POOLS_FIELD}: {entry!r} is neither namespace/name nor a name"
        keys.append(key)
    if not listed and not keys:
        listed = [namespace]
    if namespace != admin_namespace:
        foreign = sorted({n for n in listed if n != namespace} | {k[0] for k in keys if k[0] != namespace})
        if foreign:
            return (
                f"it grants {', '.join(foreign)}, but a key Secret outside the gateway's namespace "
                f"{admin_namespace} may grant only its own namespace {namespace}"
            )
    return Grant(frozenset(listed), frozenset(keys))


def _limit(name: str, text: str | None) -> int | None:
    if text is None or text == "":
        return None
    if not text.isdecimal() or not 0 < int(text) <= MAX_PER_MINUTE:
        raise ValueError(f"{name}: {text[:40]!r} is not a whole number from 1 to {MAX_PER_MINUTE}")
    return int(text)


def parse_limits(requests: str | None, tokens: str | None) -> Limits | str:
    """The limits of a key Secret's ``requestsPerMinute``/``tokensPerMinute`` fields (absent or empty: no
    limit), or why they are refused."""
    try:
        return Limits(_limit(REQUESTS_PER_MINUTE_FIELD, requests), _limit(TOKENS_PER_MINUTE_FIELD, tokens))
    except ValueError as exc:
        return str(exc)


def _bounded(name: str, text: str | None, low: int, high: int) -> int | None:
    if text is None or text == "":
        return None
    if not text.isdecimal() or not low <= int(text) <= high:
        raise ValueError(f"{name}: {text[:40]!r} is not a whole number from {low} to {high}")
    return int(text)


def parse_share(weight: str | None, priority: str | None) -> Share | str:
    """The fair-queue weight and hold priority of a key Secret's ``weight``/``priority`` fields (absent
    or empty: the defaults), or why they are refused."""
    try:
        return Share(
            _bounded(WEIGHT_FIELD, weight, 1, MAX_WEIGHT), _bounded(PRIORITY_FIELD, priority, 0, MAX_PRIORITY)
        )
    except ValueError as exc:
        return str(exc)


def token_digest(token: bytes) -> bytes:
    """What the store keeps of a key and looks a bearer token up by."""
    return hashlib.sha256(token).digest()


def bearer_token(header: bytes | None) -> bytes | None:
    """The token of ``Authorization: Bearer <token>`` (scheme case-insensitive), else None."""
    scheme, _, token = (header or b"").strip().partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None


def _field(data: Mapping[str, Any], name: str) -> str | None:
    raw = data.get(name)
    if raw is None:
        return None
    try:
        return base64.b64decode(str(raw), validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError(f"{name}: not base64-encoded UTF-8") from None


_FIELDS = (
    KEY_FIELD, NAMESPACES_FIELD, POOLS_FIELD, REQUESTS_PER_MINUTE_FIELD, TOKENS_PER_MINUTE_FIELD,
    WEIGHT_FIELD, PRIORITY_FIELD,
)  # fmt: skip


def key_from_secret(obj: Mapping[str, Any], admin_namespace: str) -> tuple[bytes, Grant, Limits, Share] | str:
    """A key Secret's (digest of its key, grant, limits, fair share), or why it is refused."""
    meta = obj.get("metadata") or {}
    data = obj.get("data") or {}
    try:
        key, namespaces, pools, requests, tokens, weight, priority = (_field(data, f) for f in _FIELDS)
    except ValueError as exc:
        return str(exc)
    if not key:
        return f"it has no {KEY_FIELD!r} in its data"
    if len(key) < MIN_KEY_LENGTH or len(key.split()) != 1:
        return f"{KEY_FIELD}: at least {MIN_KEY_LENGTH} characters without whitespace"
    grant = parse_grant(str(meta.get("namespace") or ""), admin_namespace, namespaces, pools)
    if isinstance(grant, str):
        return grant
    limits = parse_limits(requests, tokens)
    if isinstance(limits, str):
        return limits
    share = parse_share(weight, priority)
    if isinstance(share, str):
        return share
    namespace = str(meta.get("namespace") or "")
    if namespace != admin_namespace and share.outranks_default:
        return (
            f"it sets a {WEIGHT_FIELD} or {PRIORITY_FIELD} above the default, but only a key Secret in the "
            f"gateway's namespace {admin_namespace} may (a tenant's key would outrank the others)"
        )
    return token_digest(key.encode()), grant, limits, share


# ---- the store ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """What one key stands for, from every Secret that holds it: the union of their grants, the key's name
    (``KeyStore.name_of_digest``), the strictest of their limits and shares.  Merged when a Secret
    changes, not per request: a request's key check is one dictionary lookup."""

    grant: Grant
    name: str
    limits: Limits
    share: Share


def _ref(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class KeyStore:
    """Digests of the keys of every valid key Secret watched, each with its Secret's grant and limits.

    ``on_gone`` is called with a digest no Secret holds any more (deleted, refused, or its key changed),
    once the change is whole: a Secret updated with the same key, or a relist that lists it again, is
    no change of key (its limits' windows are kept)."""

    def __init__(self, admin_namespace: str, on_gone: Callable[[bytes], None] | None = None) -> None:
        self.admin_namespace = admin_namespace
        self.on_gone = on_gone
        self._secrets: dict[Key, bytes] = {}
        self._entries: dict[bytes, dict[Key, tuple[Grant, Limits]]] = {}
        self._shares: dict[Key, Share] = {}
        self._merged: dict[bytes, KeyEntry] = {}  # per digest, from ``_entries`` and ``_shares``

    def __len__(self) -> int:
        return len(self._secrets)

    def grant(self, token: bytes) -> Grant | None:
        """What ``token`` grants; None for a token no Secret holds."""
        return self.grant_of(token_digest(token))

    def entry_of(self, digest: bytes) -> KeyEntry | None:
        """Everything the key with this digest stands for; None for a digest no Secret holds."""
        return self._merged.get(digest)

    def grant_of(self, digest: bytes) -> Grant | None:
        entry = self._merged.get(digest)
        return entry.grant if entry is not None else None

    def limits_of(self, digest: bytes) -> Limits:
        """The strictest limits of the Secrets holding the key with this digest (none: no limits)."""
        entry = self._merged.get(digest)
        return entry.limits if entry is not None else NO_LIMITS

    def share_of(self, digest: bytes) -> Share:
        """The lowest weight and priority of the Secrets holding the key (none set: the defaults)."""
        entry = self._merged.get(digest)
        return entry.share if entry is not None else EQUAL_SHARE

    def name_of_digest(self, digest: bytes) -> str:
        """The key's name in the usage metrics: ``namespace/name`` of its Secret (the first, sorted, when
        several Secrets hold the same key); empty for a digest no Secret holds. Never the key itself."""
        entry = self._merged.get(digest)
        return entry.name if entry is not None else ""

    def _merge(self, digest: bytes) -> None:
        """``_merged[digest]`` from the Secrets holding the key now (none: forgotten)."""
        found = self._entries.get(digest)
        if not found:
            self._merged.pop(digest, None)
            return
        grants = iter(found.values())
        grant = next(grants)[0]
        for more, _ in grants:
            grant = grant.union(more)
        limits, share = NO_LIMITS, EQUAL_SHARE
        for ref, (_, more_limits) in found.items():
            limits = limits.strictest(more_limits)
            share = share.strictest(self._shares.get(ref, EQUAL_SHARE))
        self._merged[digest] = KeyEntry(grant, "/".join(min(found)), limits, share)

    def set_secret(self, obj: Mapping[str, Any]) -> None:
        ref = _ref(obj)
        self._gone({self._add(ref, obj)})

    def delete_secret(self, ref: Key) -> None:
        self._gone({self._remove(ref)})

    def replace(self, namespace: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of the key Secrets of ``namespace``."""
        before = {self._remove(ref) for ref in [r for r in self._secrets if r[0] == namespace]}
        for obj in objs:
            before.add(self._add(_ref(obj), obj))
        self._gone(before)

    def _add(self, ref: Key, obj: Mapping[str, Any]) -> bytes | None:
        """Take in (or refuse) the Secret ``ref``; the digest it held before, if any."""
        parsed = key_from_secret(obj, self.admin_namespace)
        before = self._remove(ref)
        if isinstance(parsed, str):
            log.warning("key Secret %s/%s refused: %s", *ref, parsed)
            return before
        digest, grant, limits, share = parsed
        self._secrets[ref] = digest
        self._shares[ref] = share
        self._entries.setdefault(digest, {})[ref] = (grant, limits)
        self._merge(digest)
        return before

    def _remove(self, ref: Key) -> bytes | None:
        digest = self._secrets.pop(ref, None)
        self._shares.pop(ref, None)
        if digest is not None:
            entries = self._entries[digest]
            del entries[ref]
            if not entries:
                del self._entries[digest]
            self._merge(digest)
        return digest

    def _gone(self, digests: set[bytes | None]) -> None:
        if self.on_gone is None:
            return
        for digest in digests:
            if digest is not None and digest not in self._entries:
                self.on_gone(digest)


# ---- the watch ----------------------------------------------------------------------------------------


def key_watch(store: KeyStore, core: client.CoreV1Api, namespace: str) -> WatchSpec:
    """The key Secrets (selected by their label) of ``namespace``, kept in ``store``."""

    def on_event(kind: str, obj: JSON) -> None:
        if kind == "DELETED":  # also sent when the label is taken off
            store.delete_secret(_ref(obj))
        else:
            store.set_secret(obj)

    return WatchSpec(
        resource="secrets",
        namespace=namespace,
        list_call=partial(core.list_namespaced_secret, namespace),
        on_list=lambda items: store.replace(namespace, items),
        on_event=on_event,
        selector=KEY_SELECTOR,
    )


def key_namespaces(admin_namespace: str | None, tenant_keys: bool, routed: list[str]) -> list[str] | str:
    """The namespaces whose key Secrets the gateway reads, its admin namespace first; or why it cannot
    start.  Only the admin namespace by default: reading Secrets in a namespace lets the gateway read
    every Secret there (RBAC cannot select by label), so tenant namespaces are read only when asked for,
    and never all of them (cluster-wide Secret reading for a process that faces every client)."""
    if not admin_namespace:
        return "--keys-namespace is needed outside a pod without --own-namespace (or --auth none, on purpose)"
    if not tenant_keys:
        return [admin_namespace]
    if not routed:
        return "--tenant-keys needs --namespace: key Secrets are never read in every namespace"
    return list(dict.fromkeys([admin_namespace, *routed]))
