"""Least-recently-used eviction: the leaf accessed longest ago goes first. No torch/simpy/time."""
from __future__ import annotations

from runtime.core.cache.tree_node import TreeNode


class LRUEviction:
    def priority_key(self, node: TreeNode) -> tuple[float, int]:
        return (node.last_access_s, node.node_id)
