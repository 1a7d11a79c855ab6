"""The gateway's API keys as Kubernetes Secrets: the label that marks one and the names of its data keys.

Whoever issues a key (an administrator with ``kubectl create secret``, the chart's NOTES, the demo, the
tests) and the gateway that reads it (``modelpool_gateway.keys``) import these names, so a key Secret has
one definition.  A key Secret::

    metadata:
      labels: {modelpool.dev/gateway-key: "true"}
    stringData:
      key: <the bearer token, at least MIN_KEY_LENGTH characters, no whitespace>
      namespaces: team-a,team-b   # optional: every pool of these namespaces ("*": every namespace)
      pools: team-c/bert,gpt      # optional: these pools ("name" alone: in the Secret's own namespace)
      requestsPerMinute: "600"    # optional: at most this many requests in any 60 s (429 past it)
      tokensPerMinute: "100000"   # optional: admitted while the last 60 s used fewer tokens (429 past it)
      weight: "2"                 # optional: its share of a full pool, against other keys' (default 1)
      priority: "10"              # optional: a pool at zero releases higher priorities first (default 0)

Without ``namespaces`` and ``pools`` a key grants the pools of its Secret's own namespace; with only
``pools``, exactly those pools.  Grants beyond the Secret's own namespace are honoured only for Secrets in
the gateway's own (admin) namespace; docs/gateway.md ("Authentication") has the whole rule.
"""

from __future__ import annotations

from typing import Final

from modelpool_contract.labels import PREFIX

#: The label that makes a Secret a gateway key (value ``KEY_LABEL_VALUE``); the gateway's watch selects
#: by it, so other Secrets are never sent to the gateway.
LABEL_GATEWAY_KEY: Final = f"{PREFIX}/gateway-key"
KEY_LABEL_VALUE: Final = "true"
#: The label selector of the gateway's key watch.
KEY_SELECTOR: Final = f"{LABEL_GATEWAY_KEY}={KEY_LABEL_VALUE}"

#: Secret data key holding the bearer token itself.
KEY_FIELD: Final = "key"
#: Secret data key: comma-separated namespaces whose every pool the key grants (``ALL_NAMESPACES``: all).
NAMESPACES_FIELD: Final = "namespaces"
#: Secret data key: comma-separated pools the key grants, ``namespace/name`` or a name in the Secret's
#: own namespace.
POOLS_FIELD: Final = "pools"
#: Secret data key: the most requests the key may send in any ``LIMIT_WINDOW_SECONDS`` (a positive
#: integer; absent: no limit).
REQUESTS_PER_MINUTE_FIELD: Final = "requestsPerMinute"
#: Secret data key: the key's requests are admitted while the tokens its answers reported using in the last
#: ``LIMIT_WINDOW_SECONDS`` are under this (a positive integer; absent: no limit).
TOKENS_PER_MINUTE_FIELD: Final = "tokensPerMinute"
#: Secret data key: the key's weight in a full pool's fair queue (``modelpool_gateway.fairness``): keys
#: waiting for the same pool are served in proportion to their weights (a positive integer; absent: 1).
WEIGHT_FIELD: Final = "weight"
#: Secret data key: the key's priority in a pool's hold at zero: higher is released first when a worker
#: comes, the lowest waits longest (an integer from 0 to ``MAX_PRIORITY``; absent: 0).
PRIORITY_FIELD: Final = "priority"
MAX_WEIGHT: Final = 1000
MAX_PRIORITY: Final = 1000
#: The window both limits are counted over.
LIMIT_WINDOW_SECONDS: Final = 60
#: The largest limit a key Secret may set (larger is refused as a typo rather than taken as "unlimited").
MAX_PER_MINUTE: Final = 10**12
#: In ``namespaces``: every namespace the gateway routes to (only in the gateway's own namespace).
ALL_NAMESPACES: Final = "*"

#: Shorter keys are refused (a guessable key is no key): 16 characters, e.g. ``openssl rand -hex 16``
#: gives 32.
MIN_KEY_LENGTH: Final = 16

#: The admin keys' namespace is by default the release namespace with this suffix (the chart's
#: ``gateway.auth.keysNamespace``, empty, and the gateway's ``--keys-namespace``, unset, agree): a namespace
#: of its own, so the gateway's right to list Secrets there never reaches the release namespace's (the
#: operator's control seed, Helm's release Secrets).
KEYS_NAMESPACE_SUFFIX: Final = "-keys"


def default_keys_namespace(release_namespace: str) -> str:
    """The admin keys' namespace of a gateway running in ``release_namespace``: ``<namespace>-keys``."""
    return release_namespace + KEYS_NAMESPACE_SUFFIX
