"""Priority eviction: lowest request priority first, least recently used among equals.

A node's priority is the max over the requests that inserted or locked it, clamped into
[min_priority, max_priority] (SGLang clamps request priorities for priority eviction to 0..99, so
out-of-range priorities rank as the nearest bound; None on a side leaves it open).
No torch/simpy/time.
"""
from __future__ import annotations

from runtime.core.cache.tree_node import TreeNode


class PriorityEviction:
    def __init__(self, min_priority: int | None = 0, max_priority: int | None = 99) -> None:
        if min_priority is not None and max_priority is not None and min_priority > max_priority:
            raise ValueError(f"min_priority {min_priority} > max_priority {max_priority}")
        self.min_priority = min_priority
        self.max_priority = max_priority

    def clamped(self, priority: int) -> int:
        if self.min_priority is not None and priority < self.min_priority:
            return self.min_priority
        if self.max_priority is not None and priority > self.max_priority:
            return self.max_priority
        return priority

    def priority_key(self, node: TreeNode) -> tuple[int, float, int]:
        return (self.clamped(node.priority), node.last_access_s, node.node_id)
