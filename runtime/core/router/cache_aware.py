"""Cache-aware DP routing, as sglang-router's `cache_aware` policy: while the replicas' loads
are balanced, send a request to the replica whose approximate prefix tree matches the longest
prefix of it (if the match is a large enough share of the input), else to the replica with the
smallest tree; once loads are imbalanced, to the least-loaded replica.

Must not import torch, simpy or time: tree eviction runs on the `now` the caller passes.
"""
from __future__ import annotations

from runtime.core.request import RequestSpec
from runtime.core.router.approx_tree import ApproxPrefixTree
from runtime.core.router.base import InFlightCounts


class CacheAwareRouter:
    """Parameters and defaults follow sglang-router (`sglang_router` RouterArgs):

    - cache_threshold: use the longest match only when matched / input tokens > this (0.3);
    - balance_abs_threshold, balance_rel_threshold: loads (requests in flight) are imbalanced
      when max - min > abs AND max > rel * min (64, 1.5); then route to the least loaded;
    - eviction_interval_s: every this many seconds of `now`, each tree drops LRU leaves down to
      max_tree_size_tokens (sglang-router: 60 s and 2**26 characters per worker; its tree holds
      text, ours token ids, so the default bound is 2**24 tokens, about as much prompt).

    Ties (equal match or equal tree size) go to the least-loaded replica, then the lowest
    index, so runs are deterministic. Every routed request is inserted in its replica's tree.
    """

    def __init__(self, num_replicas: int, cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5,
                 eviction_interval_s: float = 60.0, max_tree_size_tokens: int = 2 ** 24) -> None:
        if not 0 <= cache_threshold <= 1:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if balance_abs_threshold < 0 or balance_rel_threshold < 1:
            raise ValueError("balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1, "
                             f"got {balance_abs_threshold} and {balance_rel_threshold}")
        if eviction_interval_s <= 0 or max_tree_size_tokens < 0:
            raise ValueError("eviction_interval_s must be > 0 and max_tree_size_tokens >= 0")
        self.num_replicas = num_replicas
        self.in_flight = InFlightCounts(num_replicas)
        self.trees = [ApproxPrefixTree() for _ in range(num_replicas)]
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size_tokens = max_tree_size_tokens
        self._last_eviction_s: float | None = None
        self.num_balanced_by_load = 0        # decisions taken by the imbalance fallback
        self.num_routed_by_cache = 0         # decisions taken by the longest match

    def is_imbalanced(self) -> bool:
        loads = self.in_flight.counts
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low

    def route(self, spec: RequestSpec, now: float) -> int:
        self._maybe_evict(now)
        if self.is_imbalanced():
            self.num_balanced_by_load += 1
            replica = self.in_flight.least_loaded()
        else:
            replica = self._by_cache(spec.input_ids)
        self.trees[replica].insert(spec.input_ids, now)
        return self.in_flight.add(replica)

    def finish(self, replica: int) -> None:
        self.in_flight.remove(replica)

    def _by_cache(self, input_ids: tuple[int, ...]) -> int:
        matched = [tree.match_len(input_ids) for tree in self.trees]
        best = max(matched)
        if input_ids and best / len(input_ids) > self.cache_threshold:
            self.num_routed_by_cache += 1
            return self.in_flight.least_loaded([r for r, m in enumerate(matched) if m == best])
        smallest = min(tree.size_tokens for tree in self.trees)
        return self.in_flight.least_loaded(
            [r for r, tree in enumerate(self.trees) if tree.size_tokens == smallest])

    def _maybe_evict(self, now: float) -> None:
        if self._last_eviction_s is None:
            self._last_eviction_s = now
        elif now - self._last_eviction_s >= self.eviction_interval_s:
            for tree in self.trees:
                tree.evict_to(self.max_tree_size_tokens)
            self._last_eviction_s = now
