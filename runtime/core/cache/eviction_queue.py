"""Min-heap of eviction candidates (unlocked leaves) ordered by an eviction policy, invalidated lazily.

Must not import torch, simpy or time.
"""
from __future__ import annotations

import heapq
from typing import Any

from runtime.core.cache.eviction.base import EvictionPolicy
from runtime.core.cache.tree_node import TreeNode

_MIN_COMPACT_ENTRIES = 64


class EvictionQueue:
    """Contract: the owner calls `push(node)` whenever a node becomes a candidate or a candidate's
    eviction stats change. Pushing bumps `node.queue_version`, so exactly one entry per node is
    live; `pop` drops entries whose version is old or whose node is no longer a candidate.
    The policy key is read at push time. Stale entries are compacted away, amortised O(1)."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self._priority_key = policy.priority_key
        self._heap: list[tuple[Any, int, int, TreeNode]] = []
        self._num_pushes = 0  # unique per entry: ties never reach the node
        self._compact_at = _MIN_COMPACT_ENTRIES

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self._heap)

    def push(self, node: TreeNode) -> None:
        """(Re)queue `node` with its current key if it is a candidate; invalidates older entries."""
        node.queue_version += 1
        if node.parent is None or node.lock_ref or node.children:   # not node.is_eviction_candidate()
            return
        self._num_pushes += 1
        heap = self._heap
        heapq.heappush(heap, (self._priority_key(node), self._num_pushes, node.queue_version, node))
        if len(heap) > self._compact_at:
            self._compact()

    def pop(self) -> TreeNode | None:
        """Remove and return the candidate with the smallest key, or None if there is none."""
        heap = self._heap
        while heap:
            _, _, version, node = heapq.heappop(heap)
            if version == node.queue_version and node.parent is not None and not node.lock_ref and not node.children:
                return node                        # (node.is_eviction_candidate(), inlined)
        return None

    def clear(self) -> None:
        self._heap = []
        self._compact_at = _MIN_COMPACT_ENTRIES

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[2] == e[3].queue_version and e[3].is_eviction_candidate()]
        heapq.heapify(self._heap)
        self._compact_at = max(_MIN_COMPACT_ENTRIES, 2 * len(self._heap))
