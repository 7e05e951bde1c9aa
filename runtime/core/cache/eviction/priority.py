"""Priority eviction: lowest request priority first, least recently used among equals.

A node's priority is the max over the requests that inserted or locked it. No torch/simpy/time.
"""
from __future__ import annotations

from runtime.core.cache.tree_node import TreeNode


class PriorityEviction:
    def priority_key(self, node: TreeNode) -> tuple[int, float, int]:
        return (node.priority, node.last_access_s, node.node_id)
