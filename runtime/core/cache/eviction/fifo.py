"""First-in-first-out eviction: the leaf created first goes first. No torch/simpy/time."""
from __future__ import annotations

from runtime.core.cache.tree_node import TreeNode


class FIFOEviction:
    def priority_key(self, node: TreeNode) -> tuple[float, int]:
        return (node.created_s, node.node_id)
