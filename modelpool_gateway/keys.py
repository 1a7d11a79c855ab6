"""API keys from labelled Secrets: what each key grants (pure) and the in-memory store the watch keeps.

A key Secret (``modelpool_contract.gateway_keys``) is turned into a ``Grant`` by ``parse_grant``: the
namespaces whose every pool it grants and single pools.  The rule that keeps tenants apart: a Secret
outside the gateway's own (admin) namespace grants pools of its own namespace only; one that names
anything else is refused whole (a warning names the Secret, never the key).  Only Secrets in the admin
namespace may grant other namespaces, or every namespace (``*``).  The admin namespace is one of its own
(``--keys-namespace``, by default ``<release namespace>-keys``: ``gateway_keys.default_keys_namespace``),
never the release namespace, whose other Secrets (the operator's control seed, Helm's releases) the
gateway must not be able to list.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes_asyncio import client

from modelpool_contract.gateway_keys import (
    ALL_NAMESPACES,
    KEY_FIELD,
    KEY_SELECTOR,
    MIN_KEY_LENGTH,
    NAMESPACES_FIELD,
    POOLS_FIELD,
)
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


def key_from_secret(obj: Mapping[str, Any], admin_namespace: str) -> tuple[bytes, Grant] | str:
    """A key Secret's (digest of its key, grant), or why it is refused."""
    meta = obj.get("metadata") or {}
    data = obj.get("data") or {}
    try:
        key, namespaces, pools = (_field(data, f) for f in (KEY_FIELD, NAMESPACES_FIELD, POOLS_FIELD))
    except ValueError as exc:
        return str(exc)
    if not key:
        return f"it has no {KEY_FIELD!r} in its data"
    if len(key) < MIN_KEY_LENGTH or len(key.split()) != 1:
        return f"{KEY_FIELD}: at least {MIN_KEY_LENGTH} characters without whitespace"
    grant = parse_grant(str(meta.get("namespace") or ""), admin_namespace, namespaces, pools)
    if isinstance(grant, str):
        return grant
    return token_digest(key.encode()), grant


# ---- the store ----------------------------------------------------------------------------------------


def _ref(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class KeyStore:
    """Digests of the keys of every valid key Secret watched, each with its Secret's grant."""

    def __init__(self, admin_namespace: str) -> None:
        self.admin_namespace = admin_namespace
        self._secrets: dict[Key, bytes] = {}
        self._grants: dict[bytes, dict[Key, Grant]] = {}

    def __len__(self) -> int:
        return len(self._secrets)

    def grant(self, token: bytes) -> Grant | None:
        """What ``token`` grants; None for a token no Secret holds."""
        found = self._grants.get(token_digest(token))
        if not found:
            return None
        grants = iter(found.values())
        out = next(grants)
        for more in grants:
            out = out.union(more)
        return out

    def name_of(self, token: bytes) -> str:
        """The key's name in the usage metrics: ``namespace/name`` of its Secret (the first, sorted, when
        several Secrets hold the same key); empty for a token no Secret holds. Never the key itself."""
        found = self._grants.get(token_digest(token))
        return "/".join(min(found)) if found else ""

    def set_secret(self, obj: Mapping[str, Any]) -> None:
        ref = _ref(obj)
        parsed = key_from_secret(obj, self.admin_namespace)
        self.delete_secret(ref)
        if isinstance(parsed, str):
            log.warning("key Secret %s/%s refused: %s", *ref, parsed)
            return
        digest, grant = parsed
        self._secrets[ref] = digest
        self._grants.setdefault(digest, {})[ref] = grant

    def delete_secret(self, ref: Key) -> None:
        digest = self._secrets.pop(ref, None)
        if digest is not None:
            grants = self._grants[digest]
            del grants[ref]
            if not grants:
                del self._grants[digest]

    def replace(self, namespace: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of the key Secrets of ``namespace``."""
        for ref in [r for r in self._secrets if r[0] == namespace]:
            self.delete_secret(ref)
        for obj in objs:
            self.set_secret(obj)


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
