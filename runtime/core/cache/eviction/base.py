"""Eviction policy contract: an ordering over the radix cache's evictable leaves.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from typing import Any, Protocol

from runtime.core.cache.tree_node import TreeNode


class EvictionPolicy(Protocol):
    """Leaves are evicted in ascending order of `priority_key(node)`; the key should end with
    `node.node_id` (unique) so the order is total and deterministic. Pure: reads the node's
    stats (`last_access_s`, `created_s`, `hit_count`, `priority`, ...), mutates nothing. The
    cache reads the key when a node becomes a candidate or its stats change."""

    def priority_key(self, node: TreeNode) -> tuple[Any, ...]:
        ...
