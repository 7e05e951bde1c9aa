"""How much of a batch's attended KV is read by more than one request: radix-cache prefixes that several
running requests hold (a shared system prompt, a conversation's history). Decode attention reads them once
per request; cost models price the repeats apart (they hit in the GPU's L2 when read close together).

Must not import torch, simpy or time.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from runtime.core.cache.radix_cache import RadixCache
from runtime.core.request import Request


def shared_prefix_tokens(requests: Iterable[Request]) -> int:
    """Sum over the requests of their cache-held prefix tokens, less the distinct tokens of those
    prefixes: the KV tokens each read again after another request of the set read them. A request's
    prefix is the path from the radix root to `cache_node`, `num_locked_prefix_tokens` long; O(distinct
    nodes on the paths)."""
    seen: set[int] = set()
    held = distinct = 0
    for req in requests:
        if not req.num_locked_prefix_tokens:
            continue
        held += req.num_locked_prefix_tokens
        node = req.cache_node
        while node is not None and node.parent is not None and id(node) not in seen:
            seen.add(id(node))
            distinct += len(node.key)
            node = node.parent
    return held - distinct


def batch_shared_prefix_tokens(batch: Sequence[Request], others: Iterable[Request], cache: RadixCache) -> int:
    """`shared_prefix_tokens(batch)`, read from the cache's lock counts when every other holder of a
    lock in `cache` is among `others` (requests not in `batch`): then only the others' paths are walked,
    O(their nodes) instead of the batch's. Otherwise (a holder unaccounted for) it walks the batch."""
    return SharedPrefixCount(batch, others, cache).tokens


class SharedPrefixCount:
    """`shared_prefix_tokens` of a batch that then loses requests (`remove`), from the cache's lock
    counts: O(nodes of the requests outside the batch), each walked once. Exact only while the cache's
    locks stay as they were at construction; where a lock holder is neither in the batch nor among
    `others`, every query walks the batch instead."""

    def __init__(self, batch: Sequence[Request], others: Iterable[Request], cache: RadixCache) -> None:
        held = 0
        for req in batch:
            held += req.num_locked_prefix_tokens
        excluded = [req for req in others if req.num_locked_prefix_tokens]
        self._batch: list[Request] | None = None
        if held + sum(req.num_locked_prefix_tokens for req in excluded) != cache.locked_path_tokens():
            self._batch = list(batch)                   # unaccounted holders: walk on every query
            self.tokens = shared_prefix_tokens(self._batch)
            return
        self.tokens = cache.repeated_locked_tokens()    # over every holder: the batch and `excluded`
        self._outside: dict[int, int] = {}              # node id -> lock holders outside the batch
        for req in excluded:
            self._leave(req)

    def remove(self, requests: Iterable[Request]) -> int:
        """Take `requests` (in the batch) out of it; returns the new count."""
        if self._batch is not None:
            gone = {id(req) for req in requests}
            self._batch = [req for req in self._batch if id(req) not in gone]
            self.tokens = shared_prefix_tokens(self._batch)
            return self.tokens
        for req in requests:
            if req.num_locked_prefix_tokens:
                self._leave(req)
        return self.tokens

    def _leave(self, req: Request) -> None:
        """One holder less in the batch on each node of req's path: a node held by b >= 2 of the
        batch loses one repeat of its tokens."""
        outside = self._outside
        node = req.cache_node
        while node.parent is not None:
            key = id(node)
            count = outside.get(key, 0)
            if node.lock_ref - count >= 2:
                self.tokens -= len(node.key)
            outside[key] = count + 1
            node = node.parent
