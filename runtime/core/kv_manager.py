"""Request-level KV bookkeeping over the slot allocator and the radix cache (SGLang's
cache_unfinished_req / cache_finished_req): admit a matched prefix, allocate new tokens, release.

Must not import torch, simpy or time.
"""
from __future__ import annotations

import numpy as np

from runtime.core.cache.counting_allocator import SlotAllocator
from runtime.core.cache.radix_cache import MatchResult, RadixCache, TreeNode
from runtime.core.request import Request


class KVManager:
    """Owns the invariant: every slot of `req.kv_slots` beyond `req.num_locked_prefix_tokens` is
    private to the request; the first `num_locked_prefix_tokens` belong to the radix cache and are
    pinned by a lock on `req.cache_node`."""

    def __init__(self, allocator: SlotAllocator, cache: RadixCache) -> None:
        self.allocator = allocator
        self.cache = cache
        self.page_size = allocator.page_size
        # a counting allocator's shared placeholder slots: requests hold views of them, nothing is copied
        self.placeholder_slots: np.ndarray | None = getattr(allocator, "placeholder_slots", None)

    # -- sizes -------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.allocator.capacity_slots

    def available_tokens(self) -> int:
        """Slots that could be handed out now: free plus evictable from the cache."""
        return self.allocator.num_free_slots + self.cache.evictable_size()

    def used_tokens(self) -> int:
        return self.allocator.capacity_slots - self.allocator.num_free_slots

    # -- prefix ---------------------------------------------------------------------
    def match(self, req: Request, now: float | None = None) -> MatchResult:
        """Longest cached prefix of the request's tokens, leaving at least one token to compute
        (the last position must run through the model to give logits) and, for a request that wants
        prompt log-probabilities from `logprob_start_len` on, none from there (SGLang caps the match
        there: those positions' logits come from its own prefill). With `now` the matched nodes count
        as accessed at `now` (SGLang's match_prefix). Changes no request's state (a prompt-only request
        keeps its last match, `Request._last_match`, which the next match goes on from)."""
        outputs = req.output_ids
        tokens = req.tokens() if outputs else req.input_ids
        limit = len(tokens) - 1
        if req.sampling.logprob_start_len >= 0:
            limit = min(limit, req.sampling.logprob_start_len)
        if outputs:                    # tokens that may still change (retracted, overlap placeholders)
            return self.cache.match_prefix(tokens, max_tokens=limit, now=now)
        last = req._last_match              # (manager, match): this manager's last match of the request
        result = self.cache.match_prefix(tokens, max_tokens=limit, now=now,
                                         start=last[1] if last is not None and last[0] is self else None)
        req._last_match = (self, result)
        return result

    @staticmethod
    def newly_protected_tokens(match: MatchResult) -> int:
        """Evictable tokens that locking `match.node` would pin (its unlocked ancestors)."""
        node, total = match.node, 0
        while node.parent is not None:
            if node.lock_ref == 0:
                total += len(node.key)
            node = node.parent
        return total

    def lock_prefix(self, req: Request, match: MatchResult, now: float) -> None:
        """Pin the matched prefix for a request that owns no KV yet."""
        assert not req.num_kv_slots and req.cache_node is None, f"{req.rid} already owns KV"
        self.cache.lock(match.node, now, req.priority)
        req.cache_node = match.node
        if self.placeholder_slots is not None:
            req.hold_placeholder_slots(match.length, self.placeholder_slots)
        else:
            req.set_kv_slots_from(match.length, match.write_slots)
        req.kv_version += 1
        req.num_computed_tokens = match.length
        req.num_locked_prefix_tokens = match.length

    def unlock_prefix(self, req: Request, now: float) -> None:
        """Undo lock_prefix for a request that was not admitted after all."""
        self.cache.unlock(req.cache_node, now)
        req.cache_node = None
        req.kv_slots = ()
        req.kv_version += 1
        req.num_computed_tokens = 0
        req.num_locked_prefix_tokens = 0

    # -- allocation -----------------------------------------------------------------
    def pages_needed(self, req: Request, num_tokens: int) -> int:
        return self.allocator.num_pages_needed(req.num_kv_slots, num_tokens)

    def ensure_free_pages(self, num_pages: int, now: float) -> bool:
        """Evict from the cache until `num_pages` pages are free; False if impossible."""
        missing_slots = num_pages * self.page_size - self.allocator.num_free_slots
        if missing_slots > 0:
            self.cache.evict(missing_slots, now)
        return self.allocator.num_free_slots >= num_pages * self.page_size

    def allocate(self, req: Request, num_tokens: int, now: float) -> np.ndarray:
        """Slots (int32 [num_tokens]) for the request's next `num_tokens` positions (evicting if needed)."""
        start = req.num_kv_slots
        if not self.ensure_free_pages(self.allocator.num_pages_needed(start, num_tokens), now):
            raise MemoryError(f"KV pool exhausted allocating {num_tokens} tokens for {req.rid}")
        if self.placeholder_slots is not None:  # (a placeholder's last slot: 0)
            slots = self.allocator.allocate_slots(start, num_tokens, 0 if start else None)
            req.count_kv_slots(num_tokens)
            return slots
        last_slot = req.kv_slots[-1] if start else None
        slots = self.allocator.allocate_slots(start, num_tokens, last_slot)
        req.append_kv_slots(slots)
        return slots

    def allocate_decode(self, reqs: list[Request], now: float) -> list[int]:
        """One slot for each request's next position (one allocator call when page_size == 1):
        per request, the slot of its new token."""
        if self.page_size > 1:
            return [int(self.allocate(r, 1, now)[0]) for r in reqs]
        if not self.ensure_free_pages(len(reqs), now):
            raise MemoryError(f"KV pool exhausted allocating a decode step of {len(reqs)} requests")
        slots = self.allocator.allocate_slots(0, len(reqs), None).tolist()
        if self.placeholder_slots is not None:
            for req in reqs:
                req.count_kv_slots(1)
            return slots
        for req, slot in zip(reqs, slots):
            n = req.num_kv_slots
            buf = req._slot_buf
            if n == buf.size:
                req._grow_slots(n + 1)
                buf = req._slot_buf
            buf[n] = slot
            req.num_kv_slots = n + 1
        return slots

    def allocate_rows(self, num_rows: int, num_tokens: int, now: float) -> tuple[np.ndarray, list[int]]:
        """`num_tokens` more slots for each of `num_rows` requests in one allocator call (page_size 1
        only), as rows the caller hands to the requests (row i: int32 [num_tokens], the next slots
        of request i; the caller appends them), and the tokens of each cache leaf evicted to make
        room, in order (RadixCache.evict_leaves)."""
        assert self.page_size == 1
        total = num_tokens * num_rows
        missing = total - self.allocator.num_free_slots
        evicted = self.cache.evict_leaves(missing, now) if missing > 0 else []
        if self.allocator.num_free_slots < total:
            raise MemoryError(f"KV pool exhausted allocating {total} slots for a decode run")
        return self.allocator.allocate_slots(0, total, None).reshape(num_rows, num_tokens), evicted

    # -- caching and release ----------------------------------------------------------
    def _aligned(self, num_tokens: int) -> int:
        return num_tokens - num_tokens % self.page_size

    def _insert_computed(self, req: Request, now: float, count_hit: bool) -> tuple[int, int, TreeNode | None]:
        """Insert the page-aligned computed tokens into the cache and free the request's
        duplicates of what the cache already held. Returns (aligned length, length the cache
        already held, the node ending at the aligned length), or (locked, locked, None) when
        nothing new is inserted."""
        locked = req.num_locked_prefix_tokens
        aligned = self._aligned(req.num_computed_tokens)
        if not self.cache.enabled or aligned <= locked:
            return locked, locked, None
        num_input = len(req.input_ids)
        if aligned <= num_input:
            tokens, offset = req.input_ids, 0                # no copy of a prompt
        elif locked >= num_input:
            tokens, offset = req.output_ids, num_input       # the walk starts past the prompt
        else:
            tokens, offset = req.tokens(), 0
        already, node = self.cache.insert_path(tokens, req.kv_slots, now, req.priority, count_hit,
                                               num_tokens=aligned, start=MatchResult(locked, req.cache_node),
                                               key_offset=offset)
        if already > locked:
            self._free_slots(req, locked, already)
        return aligned, already, node

    def _free_slots(self, req: Request, start: int, end: int) -> None:
        """Give back the request's slots [start, end): by count under placeholder slots (no view made)."""
        if self.placeholder_slots is not None:
            self.allocator.free_count(end - start)
        else:
            self.allocator.free(req.kv_slots[start:end])

    def cache_unfinished(self, req: Request, now: float, chunked: bool = False) -> None:
        """After a prefill (chunk): put the computed prefix in the cache so other requests can hit
        it, and re-pin the request on the cache's copy. `chunked`: the prefill is not complete
        yet; the insert then counts no LFU hit (SGLang's cache_unfinished_req(chunked=True))."""
        aligned, already, node = self._insert_computed(req, now, count_hit=not chunked)
        if node is None:
            return
        locked = req.num_locked_prefix_tokens   # slots before `locked` are the cache's already
        self.cache.lock(node, now, req.priority)
        self.cache.unlock(req.cache_node, now)
        req.cache_node = node
        if already > locked:                    # the cache held [locked, already): use its slots
            if self.placeholder_slots is None:  # (placeholders: the same either way)
                req.kv_slots[locked:already] = self.cache.path_slots(node, aligned, locked, already)
            req.kv_version += 1
        req.num_locked_prefix_tokens = aligned

    def release(self, req: Request, now: float, count_hit: bool = True) -> None:
        """The request stops owning KV (finished, aborted or retracted): its computed tokens stay in
        the cache (evictable), everything else is freed, the lock is dropped. `count_hit=False`
        for a retraction: SGLang does not insert a retracted request's KV, so it counts no hit."""
        if req.cache_node is None:
            return
        aligned, _, _ = self._insert_computed(req, now, count_hit)
        if req.num_kv_slots > aligned:
            self._free_slots(req, aligned, req.num_kv_slots)
        self.cache.unlock(req.cache_node, now)
        req.cache_node = None
        req.kv_slots = ()
        req.kv_version += 1
        req.num_computed_tokens = 0
        req.num_locked_prefix_tokens = 0
