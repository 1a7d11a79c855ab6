"""Prefix-aware endpoint choice (pure): consistent hashing with bounded load (CHWBL), for generation pools.

Requests that start alike (the same system prompt, the same few-shot examples) are cheaper on the worker
that served that start before: an engine that caches prefixes reuses its KV cache, and even one that
does not keeps its tokenizer and chat-template caches warm. So a text-generation pool's requests are
placed on a consistent-hash ring of its workers by a *prefix key* (``prefix_key``: the leading
``chars`` characters of the chat's messages, or of the completion's prompt), as KubeAI's CHWBL does:

* each worker is ``VNODES`` points on the ring (``blake2b`` of ``namespace/name#i``: stable across
  processes and gateway replicas, so every replica sends a prefix to the same worker);
* a request goes to the first worker clockwise from its key's hash whose load is under the bound of
  Mirrokni, Thorup and Zadimoghaddam ("Consistent hashing with bounded loads"): a worker taking one more
  request may hold at most ``ceil(c * (total + 1) / n)`` in flight, ``c`` the load factor (>= 1). Past
  it, the walk goes on to the next worker, so a hot prefix spills over to its ring neighbours instead of
  queueing behind itself. With ``c >= 1`` the least loaded worker is always under the bound, so a request
  never waits for a full worker while another has room;
* adding or removing one of ``n`` workers moves only about ``1/n`` of the keys (their caches stay warm).

The load is the gateway's own count of its requests in flight to each worker (``Candidate.in_flight``):
exact and current, unlike the queue depth a worker last reported. A request without a usable prefix (a
body that is not a chat or completion, or an empty one) is routed by ``picker.pick`` as before.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

from modelpool_gateway.picker import Candidate, load_bound
from modelpool_gateway.state import Key

#: Points per worker on the ring: enough for an even split of keys at a few workers (the spread of a
#: worker's share falls as 1/sqrt(VNODES)), few enough that a ring of 100 workers builds in milliseconds.
VNODES = 64

# The ring is rebuilt when the pool's workers change; requests between changes reuse it. A ring of n
# workers is 64n hashes and references (about 50 KiB at 10 workers); past this many pools' rings the
# least recently used is rebuilt on its next request (640 hashes at 10 workers: well under a millisecond).
_RING_CACHE = 64

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def key_hash(prefix: str) -> int:
    """The ring position of a prefix key."""
    return _hash(prefix.encode("utf-8", "surrogatepass"))


@lru_cache(maxsize=_RING_CACHE)
def _ring(workers: tuple[Key, ...], vnodes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ring's points in order, and the index in ``workers`` of each point's worker."""
    points = sorted(
        (_hash(f"{ns}/{name}#{i}".encode()), index)
        for index, (ns, name) in enumerate(workers)
        for i in range(vnodes)
    )
    return tuple(p for p, _ in points), tuple(w for _, w in points)


def ring_walk(workers: Collection[Key], position: int, vnodes: int = VNODES) -> Iterator[Key]:
    """Every worker once, in the order met walking the ring clockwise from ``position`` (lazily: a pick
    stops at the first worker under the bound)."""
    ordered = tuple(sorted(set(workers)))
    if not ordered:
        return
    hashes, owners = _ring(ordered, vnodes)
    start = bisect.bisect_left(hashes, position)
    seen: set[int] = set()
    count = len(hashes)
    for step in range(count):
        owner = owners[(start + step) % count]
        if owner not in seen:
            seen.add(owner)
            yield ordered[owner]
            if len(seen) == len(ordered):
                return


def ring_order(workers: Collection[Key], position: int, vnodes: int = VNODES) -> list[Key]:
    """``ring_walk`` as a list."""
    return list(ring_walk(workers, position, vnodes))


def pick_prefix(
    candidates: Sequence[Candidate],
    position: int,
    exclude: Collection[Key] = (),
    *,
    load_factor: float = 1.25,
    vnodes: int = VNODES,
) -> Key | None:
    """The worker for a request whose prefix key hashes to ``position``: the first one clockwise under
    the load bound, or None when every candidate is excluded."""
    open_ = {c.key: c.in_flight for c in candidates if c.key not in exclude}
    if not open_:
        return None
    bound = load_bound(sum(open_.values()), len(open_), load_factor)
    for key in ring_walk(open_.keys(), position, vnodes):
        if open_[key] + 1 <= bound:
            return key
    # Unreachable for load_factor >= 1 (the least loaded is under the bound); the least loaded then.
    return min(sorted(open_), key=lambda k: open_[k])


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _chat_prefix(messages: Any, chars: int) -> str:
    if not isinstance(messages, list):
        return ""
    out: list[str] = []
    size = 0
    for message in messages:
        if size >= chars:
            break
        if not isinstance(message, dict):
            break
        # The role is part of the key: the same text as system prompt or as a user turn renders apart.
        role = message.get("role")
        piece = f"{role if isinstance(role, str) else ''}\x00{_text(message.get('content'))}\x00"
        out.append(piece[: chars - size])
        size += len(out[-1])
    return "".join(out)


def _completion_prefix(prompt: Any, chars: int) -> str:
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt[:chars]):  # token ids: their leading ones
            return ",".join(str(t) for t in prompt[:chars])[:chars]
        prompt = prompt[0]  # a batch of prompts: the first one's worker
    return prompt[:chars] if isinstance(prompt, str) else ""


def prefix_key(path: str, doc: Mapping[str, Any] | Any, chars: int) -> str | None:
    """The routing key of an OpenAI generation request: its first ``chars`` characters (the chat's
    messages in order with their roles, or the completion's prompt), or None when it has none (another
    route, a body that is not an object, no text). Never raises on a malformed body: the worker
    answers that."""
    if not isinstance(doc, Mapping) or chars <= 0:
        return None
    if path == CHAT_PATH:
        key = _chat_prefix(doc.get("messages"), chars)
    elif path == COMPLETIONS_PATH:
        key = _completion_prefix(doc.get("prompt"), chars)
    else:
        return None
    return key or None
