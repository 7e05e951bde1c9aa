"""First-in-last-out eviction: the leaf created last goes first. No torch/simpy/time."""
from __future__ import annotations

from runtime.core.cache.tree_node import TreeNode


class FILOEviction:
    def priority_key(self, node: TreeNode) -> tuple[float, int]:
        # node_id is the creation order, so on equal created_s the higher id is the newer node
        return (-node.created_s, -node.node_id)
