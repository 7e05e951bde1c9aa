"""Least-frequently-used eviction: fewest hits first, least recently used among equals.

Hits are counted by RadixCache.insert (SGLang: a finished prefill or request, not an unfinished
chunk). No torch/simpy/time.
"""
from __future__ import annotations

from runtime.core.cache.tree_node import TreeNode


class LFUEviction:
    def priority_key(self, node: TreeNode) -> tuple[int, float, int]:
        return (node.hit_count, node.last_access_s, node.node_id)
