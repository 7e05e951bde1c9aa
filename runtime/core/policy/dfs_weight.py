"""Depth-first weight (SGLang's `dfs-weight`): walk the radix tree depth first, heaviest subtree
(most waiting requests below it) first, and admit requests in post-order of their matched nodes,
so requests sharing a prefix run together.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.cache.tree_node import TreeNode
from runtime.core.policy.base import MatchFn, PolicyDefaults
from runtime.core.request import Request


class DFSWeightPolicy(PolicyDefaults):
    """SGLang's `_sort_by_dfs_weight`: a node's weight is the number of waiting requests matched
    at or below it; children are visited heaviest first, equal weights in the order the node
    holds its children (first-token insertion order, as SGLang's children dict); a node's own
    requests (arrival order) come after its subtrees. No in-batch prefix hold-back and no FCFS
    fallback on long queues, as SGLang; `max_queue_for_matching` (default None = never) is a
    twinserve switch that orders longer queues FCFS."""

    cache_aware = True

    def __init__(self, max_queue_for_matching: int | None = None) -> None:
        self.max_queue_for_matching = max_queue_for_matching

    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        queue = list(waiting)
        if not queue or (self.max_queue_for_matching is not None and len(queue) > self.max_queue_for_matching):
            return queue
        at_node: dict[int, list[Request]] = {}
        weight: dict[int, int] = {}
        root: TreeNode | None = None
        for req in queue:
            node: TreeNode | None = match(req).node
            at_node.setdefault(id(node), []).append(req)
            while node is not None:                  # one more request at or below each ancestor
                weight[id(node)] = weight.get(id(node), 0) + 1
                root, node = node, node.parent
        ordered: list[Request] = []
        stack: list[tuple[TreeNode, bool]] = [(root, False)]
        while stack:                                 # post-order, heaviest child first
            node, expanded = stack.pop()
            if expanded:
                ordered.extend(at_node.get(id(node), ()))
                continue
            stack.append((node, True))
            kids = [c for c in node.children.values() if id(c) in weight]
            kids.sort(key=lambda c: -weight[id(c)])  # stable: ties keep the children's order
            stack.extend((c, False) for c in reversed(kids))
        return ordered
