"""Depth-first weight (SGLang's `dfs-weight`): walk the radix tree depth first, heaviest subtree
(most waiting requests below it) first, and admit requests in post-order of their matched nodes, so requests sharing a prefix run together. With in-batch prefix caching.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.policy.base import MatchFn, by_arrival
from runtime.core.policy.in_batch_prefix import held_back
from runtime.core.request import Request


class DFSWeightPolicy:
    preemption_threshold: int | None = None
    stateless_order = True    # same queue and cache -> same order (no hidden state)

    def __init__(self, max_queue_for_matching: int = 128, in_batch_prefix_threshold_tokens: int = 32) -> None:
        self.max_queue_for_matching = max_queue_for_matching
        self.in_batch_prefix_threshold_tokens = in_batch_prefix_threshold_tokens

    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        queue = by_arrival(waiting)
        if len(queue) > self.max_queue_for_matching:
            return queue
        at_node: dict[int, list[Request]] = {}
        node_of: dict[int, object] = {}
        weight: dict[int, int] = {}
        children: dict[int, set[int]] = {}
        root = None
        for req in queue:
            node = match(req).node
            at_node.setdefault(id(node), []).append(req)
            child = None
            while node is not None:               # add 1 to the weight of every ancestor
                key = id(node)
                node_of[key] = node
                weight[key] = weight.get(key, 0) + 1
                if child is not None:
                    children.setdefault(key, set()).add(child)
                child, root = key, node
                node = node.parent
        held = held_back(queue, self.in_batch_prefix_threshold_tokens)
        ordered: list[Request] = []
        # post-order, as SGLang: a node's subtrees (heaviest, then oldest, first), then its own requests
        stack: list[tuple[int, bool]] = [(id(root), False)] if root is not None else []
        while stack:
            key, expanded = stack.pop()
            if expanded:
                ordered.extend(at_node.get(key, ()))
                continue
            stack.append((key, True))
            kids = sorted(children.get(key, ()), key=lambda k: (weight[k], -node_of[k].node_id))
            stack.extend((k, False) for k in kids)   # the heaviest child is popped first
        return [r for r in ordered if r not in held]      # held-back requests wait a step
