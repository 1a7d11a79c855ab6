"""What a request used, for the per-key usage metrics (issue 34 item 2): pure, no I/O.

* ``items``: what the request asks to be computed, from its parsed body: an embeddings request's inputs
  (a string is one, a list its length), an image request's ``n`` images (default 1). Read before routing.
* ``UsageScanner``: the OpenAI ``usage`` object of the answer (``prompt_tokens``, ``completion_tokens``),
  fed the answer's chunks as the gateway relays them. Every OpenAI-shaped server (ours, vLLM) writes it
  last: at the end of a JSON answer, in the last event of a stream before ``data: [DONE]``. So the scanner
  keeps only the answer's last ``TAIL_BYTES`` (a streamed answer of any length costs the same) and parses
  the last ``"usage"`` object in them once, at the end. An answer without one counts no tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

#: The answer's end kept: a usage object is under 200 bytes; the rest is the closing of the answer.
TAIL_BYTES = 4096
_USAGE = b'"usage"'
_DECODER = json.JSONDecoder()

ItemKind = Literal["embeddings", "images"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


NO_USAGE = Usage()


def items(path: str, doc: Any) -> tuple[ItemKind, int] | None:
    """The inputs an embeddings request sends, or the images an image request asks for; None otherwise."""
    if not isinstance(doc, dict):
        return None
    if path == "/v1/embeddings":
        given = doc.get("input")
        if isinstance(given, str):
            return ("embeddings", 1)
        return ("embeddings", len(given)) if isinstance(given, list) else None
    if path == "/v1/images/generations":
        n = doc.get("n", 1)
        return ("images", n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
    return None


class UsageScanner:
    """Keeps the last ``TAIL_BYTES`` of an answer; ``usage()`` parses its last usage object."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        self._tail = (self._tail + chunk)[-TAIL_BYTES:] if chunk else self._tail

    def usage(self) -> Usage:
        return parse_usage(self._tail)


def parse_usage(tail: bytes) -> Usage:
    """The last ``"usage": {...}`` object in ``tail`` with non-negative integer counts; NO_USAGE when there
    is none or it does not parse (the answer is the worker's: it never fails the request)."""
    at = tail.rfind(_USAGE)
    while at >= 0:
        found = _decode_after(tail, at + len(_USAGE))
        if found is not None:
            return found
        at = tail.rfind(_USAGE, 0, at)
    return NO_USAGE


def _decode_after(tail: bytes, start: int) -> Usage | None:
    text = tail[start:].decode("utf-8", "replace").lstrip()
    if not text.startswith(":"):
        return None
    try:
        value, _ = _DECODER.raw_decode(text[1:].lstrip())
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    counts = [value.get("prompt_tokens", 0), value.get("completion_tokens", 0)]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        return None
    return Usage(counts[0], counts[1])
