"""What parsing a JSON body would cost, measured before parsing it: items and nesting depth (pure).

A JSON body's size in bytes says little about the memory its parse takes: ``[{},{},...]`` of 16 MiB is
5.6 million dicts, about 380 MiB of Python objects, for three bytes each.  ``json_refusal`` counts the
document's structural tokens outside strings (each ``,``, ``:``, ``[`` and ``{``: ``items``, about one
Python object each, since every value but the first follows one of them) and its nesting depth
(``depth``), and names the bound a body passes (``too_many_items``, ``too_deep``) so the gateway answers
413/400 before ``orjson`` builds anything.

What the scan costs: four ``bytes.count`` calls over the body give an upper bound on both figures
(strings included); only a body over that bound is counted exactly, string by string (``bytes.find``,
escaped quotes and backslashes removed first with one ``bytes.replace``), and the walk stops as soon as
the items pass the bound, so it takes at most about ``max_items`` steps whatever the body's size.  Its
depth is walked only once its items are known to be within the bound (so over at most ``2 * max_items``
brackets).  Malformed JSON (an unterminated string, strings side by side, unbalanced brackets) is
measured as far as it is well formed and left to the parser to refuse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_OPENERS = frozenset(b"[{")

TOO_MANY_ITEMS = "too_many_items"
TOO_DEEP = "too_deep"


@dataclass(frozen=True)
class JsonCost:
    """A document's structural tokens outside strings (``items``), and its nesting depth (counted up to
    a limit: a deeper one reads ``limit + 1``)."""

    items: int
    depth: int


def _tokens(text: bytes, start: int = 0, end: int | None = None) -> tuple[int, int]:
    """(items, openers) of ``text[start:end]``, strings and all; no copy."""
    openers = text.count(b"[", start, end) + text.count(b"{", start, end)
    return text.count(b",", start, end) + text.count(b":", start, end) + openers, openers


def _depth(structure: bytes, limit: int) -> int:
    """The deepest nesting of the brackets in ``structure`` (no strings in it), up to ``limit + 1``."""
    depth = deepest = 0
    for byte in _NOT_BRACKET.sub(b"", structure):
        if byte in _OPENERS:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def _outside_strings(body: bytes, max_items: int) -> tuple[int, int, list[tuple[int, int]], bytes]:
    """(items, openers, spans outside strings, the text the spans index), walking string by string and
    stopping once the items pass ``max_items`` or the strings outnumber the tokens before them (no
    longer JSON: the parser will refuse it where it stops)."""
    # In valid JSON a backslash only starts a two-byte escape: dropping every "\\" and then every '\"'
    # leaves a quote only where a string starts or ends.
    text = body.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in body else body
    items = openers = strings = 0
    spans: list[tuple[int, int]] = []
    pos, size = 0, len(text)
    while pos < size and items <= max_items and strings <= items + 1:
        quote = text.find(b'"', pos)
        end = size if quote < 0 else quote
        found, opened = _tokens(text, pos, end)
        items, openers = items + found, openers + opened
        spans.append((pos, end))
        close = text.find(b'"', quote + 1) if quote >= 0 else -1
        if close < 0:
            break
        strings += 1
        pos = close + 1
    return items, openers, spans, text


def measure(body: bytes, *, max_items: int, depth_limit: int) -> JsonCost:
    """The cost of ``body``: its items (exact up to just past ``max_items``) and depth (up to
    ``depth_limit + 1``)."""
    items, _, spans, text = _outside_strings(body, max_items)
    return JsonCost(items, _depth(b"".join(text[a:b] for a, b in spans), depth_limit))


def json_refusal(body: bytes, *, max_items: int, max_depth: int) -> str | None:
    """Why parsing ``body`` is refused (``TOO_MANY_ITEMS``, ``TOO_DEEP``), or None when it is within both
    bounds (see the module docstring for what it costs)."""
    items, openers = _tokens(body)
    if items <= max_items and openers <= max_depth:  # the upper bounds: nothing to count exactly
        return None
    items, openers, spans, text = _outside_strings(body, max_items)
    if items > max_items:
        return TOO_MANY_ITEMS
    if openers > max_depth and _depth(b"".join(text[a:b] for a, b in spans), max_depth) > max_depth:
        return TOO_DEEP
    return None
