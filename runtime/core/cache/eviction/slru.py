"""Segmented LRU eviction: probationary leaves (fewer than `protected_hits` hits) go first, in LRU
order, then protected ones in LRU order. No torch/simpy/time."""
from __future__ import annotations

from runtime.core.cache.tree_node import TreeNode


class SLRUEviction:
    def __init__(self, protected_hits: int = 2) -> None:
        if protected_hits < 1:
            raise ValueError(f"protected_hits must be >= 1, got {protected_hits}")
        self.protected_hits = protected_hits

    def priority_key(self, node: TreeNode) -> tuple[int, float, int]:
        is_protected = 1 if node.hit_count >= self.protected_hits else 0
        return (is_protected, node.last_access_s, node.node_id)
