"""One node of the radix prefix cache, plus the C-speed prefix comparison its edges need.

Must not import torch, simpy or time: timestamps (`*_s`, seconds) are given by the caller.
"""
from __future__ import annotations

from array import array
from typing import Any, Hashable, Sequence


class TreeNode:
    """An edge of the radix tree: `key` (token ids: a slice of what was inserted, a list or tuple, or a read-only view (memoryview) of an inserted int32 array, never copied) and `slots` (their KV slot indices, int32,
    same length; a whole number of pages; never written in place, so splits may share them). Children are keyed by `edge_key` of their key.

    `lock_ref` counts running requests pinning this node (> 0: protected from eviction).
    `hit_count`, `last_access_s`, `created_s`, `priority` feed the eviction policies; `node_id`
    is a per-cache creation counter used as the final tie-breaker. `queue_version` is bumped each
    time the node is (re)queued as an eviction candidate, so older queue entries are ignored.
    """

    __slots__ = (
        "children", "parent", "key", "slots", "lock_ref", "last_access_s", "created_s",
        "hit_count", "priority", "node_id", "queue_version", "evicted",
    )

    def __init__(
        self,
        node_id: int,
        parent: TreeNode | None,
        key: Sequence[int],
        slots: Any,
        now: float,
        priority: int = 0,
    ) -> None:
        self.children: dict[Hashable, TreeNode] = {}
        self.parent: TreeNode | None = parent
        self.key: Sequence[int] = key
        self.slots = slots          # np.ndarray int32 [len(key)]
        self.lock_ref: int = 0
        self.last_access_s: float = now
        self.created_s: float = now
        self.hit_count: int = 0
        self.priority: int = priority
        self.node_id: int = node_id
        self.queue_version: int = 0
        self.evicted: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.key)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def is_eviction_candidate(self) -> bool:
        """An unlocked leaf that is still in the tree and is not the root."""
        return self.parent is not None and self.lock_ref == 0 and not self.children

    def __repr__(self) -> str:
        return (f"TreeNode(id={self.node_id}, tokens={len(self.key)}, lock_ref={self.lock_ref}, "
                f"hits={self.hit_count}, children={len(self.children)})")


def edge_key(tokens: Sequence[int], pos: int, page_size: int) -> Hashable:
    """The dict key of the edge starting at tokens[pos]: the token itself, or the first page."""
    if page_size == 1:
        return tokens[pos]
    return tuple(tokens[pos:pos + page_size])


_BUFFERS = (array, memoryview)   # compared with each other by value (an edge may be a view of an int32 array)


def common_prefix_len(tokens: Sequence[int], pos: int, edge: Sequence[int], end: int | None = None) -> int:
    """Length of the common prefix of tokens[pos:end] and `edge`, using slice comparisons only
    (C speed): one whole-slice compare, then halving chunks to locate the first mismatch.
    Sequences of different types (see radix_cache.TOKEN_SEQUENCES) compare as lists."""
    stop = pos + len(edge) if end is None else min(pos + len(edge), end)
    segment = tokens[pos:stop]
    if segment == edge:
        return len(edge)
    if type(segment) is not type(edge) and not (type(segment) in _BUFFERS and type(edge) in _BUFFERS):
        segment, edge = list(segment), list(edge)   # a prompt (tuple, int32 array) against outputs (list)
        if segment == edge:
            return len(edge)
    limit = len(segment)
    if limit < len(edge) and segment == edge[:limit]:
        return limit
    low, high = 0, limit  # segment[:low] == edge[:low]; the first mismatch is in [low, high)
    while high - low > 1:
        mid = (low + high) // 2
        if segment[low:mid] == edge[low:mid]:
            low = mid
        else:
            high = mid
    return low
