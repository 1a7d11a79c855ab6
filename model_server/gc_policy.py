"""Garbage collection off the request path, in every process of a worker.

CPython collects its young generation every 700 container allocations.  A forward pass of a transformers
model allocates thousands (module outputs, ModelOutput dicts, tensors' Python wrappers), so a lone
request at one connection paid one to three collections in the inference process, each holding the GIL
(the event loop's replies wait) for a millisecond to tens of them on a loaded machine (measured with
``gc.callbacks`` on 2 busy cores: 88 collections over 2 ms in 130 one-sentence requests).  Here:

* ``tune``: a young generation of ``YOUNG_THRESHOLD`` allocations: under steady load collections still
  run, but rarely, and each costs about the same (young objects are mostly freed by reference counting
  already: a collection walks the survivors); and everything alive at start-up (the web stack in an HTTP
  process; the model, torch and transformers in the inference process, frozen after its load) is moved
  out of the collector's sight with ``gc.freeze``, so the full collections that do run walk only what
  requests left behind;
* ``collect_young``: the inference process collects its young generations itself when its queue runs
  empty, after the answers have gone out: while the client reads its answer and sends the next request.
"""

from __future__ import annotations

import gc

# Allocations (net of frees) between two collections of the young generation (CPython's default: 700).
YOUNG_THRESHOLD = 50_000


def tune(freeze: bool = True) -> None:
    """A serving process's collector: a large young generation; with ``freeze``, what exists now is
    permanent (call once start-up has built its long-lived objects)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    if freeze:
        gc.freeze()


def collect_young() -> int:
    """Collect the young generations (0 and 1) now, between requests; returns the objects freed."""
    return gc.collect(1) if gc.get_count()[0] else 0


__all__ = ["YOUNG_THRESHOLD", "collect_young", "tune"]
