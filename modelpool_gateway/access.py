"""Who may use which pool: the bearer-key check every request passes first, and each key's view of pools.

``Access.check`` runs before anything else in the gateway (``Gateway.__call__``): a request outside
``OPEN_PATHS`` without a key the store holds is answered 401 (``WWW-Authenticate: Bearer``) in its
protocol's error shape, having read no body, resolved no name and held nothing.  A request with a key
carries its ``Grant`` in the ASGI scope (``GRANT_SCOPE_KEY``), with its digest, name and limits per minute
(``limits``: the app admits it or answers 429 once the model is resolved), and every name it sends is
resolved in ``Access.index(grant)``: a name index of the granted pools only, so a pool the key does not
grant is not found, exactly like a pool that does not exist (same 404, same message), and never held,
woken or listed; nor can another tenant's pool make a granted name ambiguous.

Open without a key: the gateway's own health and readiness (``OPEN_PATHS``), which the kubelet calls
without one; they carry no model data.  ``/metrics`` is open too, to answer 404 to anyone: the metrics,
which name every tenant's pools, are on a port of their own (``Metrics.serve``), not the clients'.
With ``--auth none`` every request gets ``EVERYTHING``.

With keys, the ``Authorization`` header stops here (``upstream_headers``): a worker runs its pool owner's
code, which must not collect keys that may grant other namespaces' pools.  With ``--auth none`` it passes
to the worker as before (a pool's own worker key, ``spec.auth``, sent through the gateway).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Literal

from modelpool_gateway.cache import Registry
from modelpool_gateway.errors import Send, send_error
from modelpool_gateway.fairness import EQUAL_SHARE, Share
from modelpool_gateway.keys import EVERYTHING, Grant, KeyEntry, KeyStore, bearer_token, token_digest
from modelpool_gateway.limits import NO_LIMITS, Limits
from modelpool_gateway.names import NameIndex

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"})
GRANT_SCOPE_KEY = "modelpool.grant"
# Who is calling (the key's digest; absent with --auth none): what the held requests are counted per.
CALLER_SCOPE_KEY = "modelpool.caller"
# The key's name (its Secret's namespace/name): what the usage metrics are labelled by; absent: no key.
KEY_NAME_SCOPE_KEY = "modelpool.key_name"
# The key's limits per minute (``limits``); absent: none (``--auth none``).
LIMITS_SCOPE_KEY = "modelpool.limits"
# The key's weight and priority (``fairness.Share``); absent: the defaults.
SHARE_SCOPE_KEY = "modelpool.share"
NOTHING = Grant()
# Scoped indexes kept at most (one per distinct grant in use); all are dropped when the pools change.
_INDEX_CACHE_LIMIT = 1024


def caller_of(scope: MutableMapping[str, Any]) -> bytes | None:
    """The caller ``Access.check`` recorded (its key's digest); None with ``--auth none``."""
    caller: bytes | None = scope.get(CALLER_SCOPE_KEY)
    return caller


def key_name_of(scope: MutableMapping[str, Any]) -> str:
    """The name of the key ``Access.check`` accepted (``KeyStore.name_of_digest``); empty with
    ``--auth none``, for a refused key and on the open paths."""
    name: str = scope.get(KEY_NAME_SCOPE_KEY, "")
    return name


def limits_of(scope: MutableMapping[str, Any]) -> Limits:
    """The limits of the key ``Access.check`` accepted; none with ``--auth none``."""
    limits: Limits = scope.get(LIMITS_SCOPE_KEY, NO_LIMITS)
    return limits


def share_of(scope: MutableMapping[str, Any]) -> Share:
    """The weight and priority of the key ``Access.check`` accepted; the defaults with ``--auth none``."""
    share: Share = scope.get(SHARE_SCOPE_KEY, EQUAL_SHARE)
    return share


def grant_of(scope: MutableMapping[str, Any]) -> Grant:
    """The grant ``Access.check`` put in the scope; none at all where it put none (fail closed)."""
    grant: Grant = scope.get(GRANT_SCOPE_KEY, NOTHING)
    return grant


class Access:
    """The check (``auth`` mode ``keys`` or ``none``) and the per-grant name indexes."""

    def __init__(self, mode: Literal["keys", "none"], keys: KeyStore | None, registry: Registry) -> None:
        if mode == "keys" and keys is None:
            raise ValueError("auth mode 'keys' needs a key store")
        self.mode = mode
        self.keys = keys
        self.registry = registry
        self._indexes: dict[Grant, NameIndex] = {}
        self._built_from: NameIndex | None = None

    def _lookup(self, headers: list[tuple[bytes, bytes]]) -> tuple[KeyEntry, bytes] | str | None:
        """The request's key (what it stands for, and its digest); None with ``--auth none``; or the
        refusal's reason."""
        if self.mode == "none" or self.keys is None:
            return None
        header = None
        for name, value in headers:
            if name == b"authorization":
                header = value
                break
        token = bearer_token(header)
        if token is None:
            return "missing_key" if header is None else "invalid_key"
        digest = token_digest(token)
        entry = self.keys.entry_of(digest)
        return (entry, digest) if entry is not None else "invalid_key"

    def authenticate(self, headers: list[tuple[bytes, bytes]]) -> Grant | str:
        """The request's grant, or the refusal's reason (``missing_key``, ``invalid_key``)."""
        found = self._lookup(headers)
        if found is None:
            return EVERYTHING
        return found if isinstance(found, str) else found[0].grant

    async def check(self, scope: MutableMapping[str, Any], send: Send) -> str | None:
        """Put the grant in ``scope``; or answer 401 and return the reason."""
        if scope["path"] in OPEN_PATHS:
            return None
        found = self._lookup(scope["headers"])
        if found is None:
            scope[GRANT_SCOPE_KEY] = EVERYTHING
            return None
        if not isinstance(found, str):
            entry, scope[CALLER_SCOPE_KEY] = found
            scope[GRANT_SCOPE_KEY], scope[KEY_NAME_SCOPE_KEY] = entry.grant, entry.name
            scope[LIMITS_SCOPE_KEY], scope[SHARE_SCOPE_KEY] = entry.limits, entry.share
            return None
        what = "missing API key" if found == "missing_key" else "invalid API key"
        await send_error(
            send,
            scope["path"].startswith("/v1/"),
            401,
            "unauthorized",
            f"{what}: send the header 'Authorization: Bearer <key>'",
            headers=[(b"www-authenticate", b"Bearer")],
        )
        return found

    def upstream_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The request's headers as they may go to a worker (see the module docstring)."""
        if self.mode == "none":
            return headers
        return [(k, v) for k, v in headers if k != b"authorization"]

    def index(self, grant: Grant) -> NameIndex:
        """The names of the pools ``grant`` allows (the registry's own index for everything)."""
        full = self.registry.index
        if grant.everything:
            return full
        if self._built_from is not full or len(self._indexes) >= _INDEX_CACHE_LIMIT:
            self._indexes.clear()
            self._built_from = full
        found = self._indexes.get(grant)
        if found is None:
            pools = (p for p in self.registry.pools.values() if grant.allows(p.key))
            found = self._indexes[grant] = NameIndex.build(pools)
        return found
