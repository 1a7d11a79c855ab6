"""Prefix sharing on transformers' continuous-batching cache, with the blocks counted exactly.

With ``allow_block_sharing`` the manager (transformers 5.24, ``continuous_batching/cache.py``) hashes
every full block of 32 tokens (chained: a block's hash covers every token before it), so a request whose
prompt starts with blocks already in the cache takes them (``search_prefix_match``: the prompt's leading
full blocks, never the last token) and prefills only the rest.  A finished request's hashed blocks are
not freed: they stay in the ledger's ``cached_blocks``, referenced by nobody, for the next request with
the same prefix.

Two things the manager gets wrong for a server whose admission is in tokens (``generation_engine``:
each running request reserves prompt + ``max_tokens``, the sum never above the cache), fixed here on
the cache object (``PrefixCache.install``):

* **Cached blocks are evicted late, and all at once.**  The scheduler evicts them only when the free
  share drops under its safety margin (a share that does not count them as free), or when no request at
  all can be scheduled (``offload_requests`` evicts every one first).  So an admitted request that needs
  more blocks than are free beside the running ones waits for those to finish while cached blocks nobody
  uses hold its room (measured: ``tests/server/unit/test_prefix_sharing.py``, a request of 4 pages
  beside a long one ran only after the long one's 100 tokens), and then every cached prefix goes.  Here a
  request that does not fit evicts the least recently released cached blocks, one at a time, until it
  does (``_can_store``), and the free capacity counts cached blocks as free (``_free_capacity``), so the
  margin judges what a request can really have and the engine's ``tables`` read the truth.
* **Nothing says how much was reused.**  ``_search`` records each request's matched tokens, which the
  engine turns into ``modelpool_prefix_cache_hit_tokens_total`` at its first token.

Blocks are hashed on token ids alone, so a prefix computed with one LoRA adapter would be reused for
another: the engine turns sharing off for a model with adapters.

Threads: the hooks run on the manager's thread (its scheduler calls them); ``hits`` is read and popped
on the event loop (a dict's single operations are atomic).
"""

from __future__ import annotations

from typing import Any


class PrefixCache:
    """The hooks on one ``PagedAttentionCache`` (see the module docstring)."""

    def __init__(self, cache: Any) -> None:
        self._cache = cache
        self._store = cache.can_store_request_tokens
        self._free = cache.compute_free_capacity
        self._match = cache.search_prefix_match
        self.hits: dict[str, int] = {}  # request id -> prompt tokens it took from the cache
        self.hit_tokens = 0  # every request's, since the start
        self.evicted_blocks = 0  # cached blocks evicted to make room

    @classmethod
    def install(cls, cache: Any) -> PrefixCache:
        """Put the hooks on ``cache`` (instance attributes: the scheduler looks its methods up on it)."""
        hooks = cls(cache)
        cache.can_store_request_tokens = hooks._can_store
        cache.compute_free_capacity = hooks._free_capacity
        cache.search_prefix_match = hooks._search
        return hooks

    def cached_blocks(self) -> int:
        """Blocks kept for their prefix, referenced by no request (evictable: they count as free)."""
        return sum(len(a.ledger.cached_blocks) for a in self._cache.cache_allocators.values())

    def _can_store(self, state: Any, request_len: int, dry_run: bool = False) -> bool:
        """The manager's check-and-allocate, evicting cached blocks (least recently released first) while
        the request does not fit.  A dry run evicts nothing."""
        while True:
            if self._store(state, request_len, dry_run):
                return True
            if dry_run or not self._evict_one():
                return False

    def _evict_one(self) -> bool:
        """Give the least recently released cached block back to the pool, its hash forgotten (as the
        ledger's own ``evict_cached_blocks`` does for all of them); False when none is cached."""
        for allocator in self._cache.cache_allocators.values():
            ledger = allocator.ledger
            if not ledger.cached_blocks:
                continue
            block = next(iter(ledger.cached_blocks))
            del ledger.cached_blocks[block]
            ledger.hash_to_block.pop(ledger.block_to_hash.pop(block))
            self._cache.pool.free_blocks(allocator.index, [block])
            self.evicted_blocks += 1
            return True
        return False

    def _free_capacity(self, relative: bool = True) -> int | float:
        """The manager's free capacity with the cached blocks counted as free (they are, on demand)."""
        cache = self._cache
        cached: int = sum(
            len(a.ledger.cached_blocks) * a.bytes_per_block for a in cache.cache_allocators.values()
        )
        whole: int = cache.num_sectors * cache.bytes_per_sector
        free: int | float = self._free(relative)
        return free + (cached / whole if relative else cached)

    def _search(self, request_id: str, prompt_ids: list[int]) -> int:
        matched: int = self._match(request_id, prompt_ids)
        if matched:
            self.hits[request_id] = matched
            self.hit_tokens += matched
        return matched


__all__ = ["PrefixCache"]
