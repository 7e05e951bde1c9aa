"""Radix prefix cache over token ids: maps cached prefixes to the KV slots that hold them.

Must not import torch, simpy or time: every timestamp `now` (seconds) is passed in.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, Sequence

import numpy as np

from runtime.core.cache.allocator import SLOT_DTYPE
from runtime.core.cache.counting_allocator import SlotAllocator
from runtime.core.cache.eviction.base import EvictionPolicy
from runtime.core.cache.eviction_queue import EvictionQueue
from runtime.core.cache.tree_node import TreeNode, common_prefix_len, edge_key

__all__ = ["MatchResult", "RadixCache", "TreeNode"]

# token sequences used as they are (no copy; edges are slices of them); others become lists
TOKEN_SEQUENCES = (list, tuple, array)


@dataclass(eq=False)
class MatchResult:
    """`length` tokens matched (a multiple of page_size); `node` the deepest matched node, ending
    exactly at `length` (the root when length == 0); `slot_array` their KV slots (int32
    [length]; `slots` as a list), gathered from the path root..node when first read (admission reads them; ordering and
    budget checks need only the length), so read them before `node` can be evicted."""

    length: int
    node: TreeNode

    @cached_property
    def slot_array(self) -> np.ndarray:
        """The matched slots, int32 [length] (a fresh array)."""
        if self.node.evicted:
            raise ValueError(f"slots of an evicted match ({self.node}); read them right after matching")
        path = []
        node = self.node
        while node.parent is not None:
            path.append(node.slots)
            node = node.parent
        if not path:
            return np.empty(0, dtype=SLOT_DTYPE)
        return np.concatenate(path[::-1])

    @property
    def slots(self) -> list[int]:
        """`slot_array` as a list."""
        return self.slot_array.tolist()

    def write_slots(self, out: np.ndarray) -> None:
        """Write the matched slots into out[:length] (what `slot_array` holds, without making it),
        node by node from the deepest back to the root."""
        if "slot_array" in self.__dict__:
            out[:self.length] = self.slot_array
            return
        if self.node.evicted:
            raise ValueError(f"slots of an evicted match ({self.node}); read them right after matching")
        end = self.length
        node = self.node
        while node.parent is not None:
            begin = end - len(node.slots)
            out[begin:end] = node.slots
            node, end = node.parent, begin


class RadixCache:
    """Prefix tree of token ids -> KV slots. The tree owns the slots of its nodes; they return to
    `allocator` only through `evict` (or `reset`). Every edge holds a whole number of pages.

    Sizes (tokens == slots): evictable (lock_ref == 0) + protected (lock_ref > 0) == total,
    all kept as O(1) counters. Candidates for eviction are unlocked leaves, kept in a heap.
    """

    def __init__(
        self,
        allocator: SlotAllocator,
        eviction: EvictionPolicy,
        page_size: int = 1,
        enabled: bool = True,
    ) -> None:
        if page_size != allocator.page_size:
            raise ValueError(f"page_size {page_size} != allocator.page_size {allocator.page_size}")
        self.allocator = allocator
        self.eviction = eviction
        self.page_size: int = page_size
        self.enabled: bool = enabled
        self._queue = EvictionQueue(eviction)
        self._clear_tree()

    def _clear_tree(self) -> None:
        self._next_node_id = 0
        self.root: TreeNode = self._new_node(None, [], np.empty(0, dtype=SLOT_DTYPE), now=0.0, priority=0)
        self._evictable_tokens = 0
        self._protected_tokens = 0
        self._locked_path_tokens = 0     # sum over locks of the tokens root..node they pin
        self._repeated_locked_tokens = 0  # sum over nodes of len(key) * max(lock_ref - 1, 0)
        self.num_nodes = 0  # excluding the root
        self._queue.clear()

    # -- sizes (tokens) -----------------------------------------------------------------
    def evictable_size(self) -> int:
        return self._evictable_tokens

    def protected_size(self) -> int:
        return self._protected_tokens

    def total_size(self) -> int:
        return self._evictable_tokens + self._protected_tokens

    def locked_path_tokens(self) -> int:
        """Tokens pinned per lock, summed over the locks held (a token under two locks counts twice)."""
        return self._locked_path_tokens

    def repeated_locked_tokens(self) -> int:
        """`locked_path_tokens` less the distinct locked tokens: of the prefixes the lock holders
        pin, the tokens each holder shares with a holder counted before it."""
        return self._repeated_locked_tokens

    # -- lookup and insertion ---------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int], max_tokens: int | None = None,
                     now: float | None = None, start: MatchResult | None = None) -> MatchResult:
        """Longest cached page-aligned prefix of `token_ids[:max_tokens]` (no copy is made of a
        list, tuple or array). Changes no sizes; may split a node so that the returned node ends exactly at
        `length`. With `now`, every node walked gets last_access_s = now, the partly matched one
        included (SGLang's RadixCache._match_prefix_helper): prefixes that waiting requests keep
        matching stay recent for LRU. Without `now` (checks, statistics) no stats change.
        `start`: an earlier match of these same tokens whose node is still in the tree; the walk
        goes on from it without comparing its `length` tokens again (the tree only loses a path by
        evicting its deepest node first, and splits keep every node's end depth)."""
        if not self.enabled:
            return MatchResult(0, self.root)
        if type(token_ids) in TOKEN_SEQUENCES:
            key, limit = token_ids, len(token_ids) if max_tokens is None else min(max_tokens, len(token_ids))
            limit -= limit % self.page_size
        else:
            key = self._aligned_key(token_ids[:max_tokens] if max_tokens is not None else token_ids)
            limit = len(key)
        node, pos, deepest = self.root, 0, None
        if start is not None and start.length <= limit and not start.node.evicted:
            node, pos = start.node, start.length
            if now is not None and node.parent is not None:
                deepest = node
                ancestor = node
                while ancestor.parent is not None:
                    ancestor.last_access_s = now
                    ancestor = ancestor.parent
        while pos < limit:
            child = node.children.get(edge_key(key, pos, self.page_size))
            if child is None:
                break
            if now is not None:
                child.last_access_s = now          # before a split: head and tail are both touched
                deepest = child
            matched = self._matched_len(key, pos, child, limit)
            ends_inside_edge = matched < len(child.key)
            if ends_inside_edge:
                child = self._split(child, matched)
            node, pos = child, pos + matched
            if ends_inside_edge:
                break
        if deepest is not None:
            self._queue.push(deepest)              # the only touched node that can be a leaf
        return MatchResult(pos, node)

    def insert(self, token_ids: Sequence[int], slots: Sequence[int], now: float, priority: int = 0,
               count_hit: bool = True, num_tokens: int | None = None) -> int:
        """Cache `token_ids` -> `slots` (equal lengths; only the page-aligned head is inserted, the
        unaligned tail is ignored). With `num_tokens`, only the first num_tokens of both (which
        may be longer) count, and no copy is made of lists beyond what the tree keeps. Returns how
        many leading tokens (page-aligned) were ALREADY in the tree; for those the tree keeps its
        own slots. Never frees. The caller, which holds a
        lock on its first `locked` tokens (the tree's own slots), then frees its duplicates
        slots[locked:returned] and, when done with them, its tail slots[aligned_len:]; the tree
        now owns slots[returned:aligned_len]. (enabled=False: nothing is inserted, 0 is returned
        and the caller still owns every slot it computed.) Touches the matched path
        (last_access_s = now, priority = max); new nodes get created_s = now. With `count_hit`
        every node of the inserted path, the new leaf included, counts one hit (hit_count += 1):
        SGLang counts LFU hits here and not for the inserts of unfinished chunks
        (RadixCache._insert_helper / _inc_hit_count with chunked=True)."""
        return self.insert_path(token_ids, slots, now, priority, count_hit, num_tokens)[0]

    def insert_path(self, token_ids: Sequence[int], slots: Sequence[int], now: float, priority: int = 0,
                    count_hit: bool = True, num_tokens: int | None = None,
                    start: MatchResult | None = None, key_offset: int = 0) -> tuple[int, TreeNode]:
        """`insert`, also returning the node that ends at the inserted (page-aligned) length (the
        root when nothing is inserted). `start`: a node known to hold the first start.length
        tokens (e.g. the one the caller has locked); its path is touched without comparing its
        tokens again and the walk goes on from it. `key_offset`: token_ids[i] is the token at
        position key_offset + i (the tokens before it are never read: start.length >= key_offset),
        so a caller holding a prefix need not build the whole token list; slots stay whole."""
        if num_tokens is None:
            if len(slots) != len(token_ids) + key_offset:
                raise ValueError(f"insert needs one slot per token: {len(token_ids)} tokens, {len(slots)} slots")
            num_tokens = len(slots)
        elif not 0 <= num_tokens <= min(len(token_ids) + key_offset, len(slots)):
            raise ValueError(f"insert of {num_tokens} tokens from {len(token_ids)} tokens, {len(slots)} slots")
        if not self.enabled:
            return 0, self.root
        off = key_offset
        key = token_ids if type(token_ids) in TOKEN_SEQUENCES else list(token_ids[:num_tokens - off])
        limit = num_tokens - num_tokens % self.page_size
        node, pos = self.root, 0
        from_start = start is not None and 0 < start.length <= limit
        if from_start:
            if start.node.evicted:
                raise ValueError(f"insert from an evicted node {start.node}")
            node, pos = start.node, start.length
        if pos < off:
            raise ValueError(f"insert with key_offset {off} must start at least there, not at {pos}")
        if from_start:
            ancestor = node
            while ancestor.parent is not None:          # the same touch as walking down to it
                ancestor.last_access_s = now
                ancestor.priority = max(ancestor.priority, priority)
                ancestor.hit_count += count_hit
                ancestor = ancestor.parent
        while pos < limit:
            child = node.children.get(edge_key(key, pos - off, self.page_size))
            if child is None:
                leaf_slots = self.allocator.kept_slots(slots[pos:limit])   # the tree's own copy
                # an int32 array (a prompt, never mutated) is kept as a view of it, not copied
                edge = memoryview(key)[pos - off:limit - off] if type(key) is array else key[pos - off:limit - off]
                leaf = self._add_leaf(node, edge, leaf_slots, now, priority, hit_count=int(count_hit))
                return pos, leaf
            matched = self._matched_len(key, pos - off, child, limit - off)
            if matched < len(child.key):
                child = self._split(child, matched)
            child.last_access_s = now
            child.priority = max(child.priority, priority)
            child.hit_count += count_hit
            node, pos = child, pos + matched
        self._queue.push(node)  # a fully present key may end at a leaf whose stats just changed
        return pos, node

    def path_slots(self, node: TreeNode, depth: int, start: int, stop: int) -> np.ndarray:
        """Slots (int32) of positions [start, stop) on the path root..node, `node` ending at `depth`,
        gathered from the nodes that cover them only."""
        parts: list[np.ndarray] = []
        end = depth
        while node.parent is not None and end > start:
            begin = end - len(node.key)
            if begin < stop:
                parts.append(node.slots[max(start, begin) - begin:min(stop, end) - begin])
            node, end = node.parent, begin
        if not parts:
            return np.empty(0, dtype=SLOT_DTYPE)
        return np.concatenate(parts[::-1])

    # -- pinning ------------------------------------------------------------------------------
    def lock(self, node: TreeNode, now: float, priority: int = 0) -> None:
        """Pin root..node for a running request: lock_ref += 1 on each node (its tokens move from
        evictable to protected), last_access_s = now, priority = max(priority, node.priority).
        Hits are not counted here (see `insert`). Locking the root is a no-op."""
        if node.evicted:
            raise ValueError(f"cannot lock {node}: it was evicted (lock right after match_prefix)")
        locked = pinned = repeated = 0
        while node.parent is not None:
            n = len(node.key)
            locked += n
            ref = node.lock_ref
            if ref == 0:
                pinned += n
            else:
                repeated += n
            node.lock_ref = ref + 1
            node.last_access_s = now
            if priority > node.priority:
                node.priority = priority
            node = node.parent
        self._evictable_tokens -= pinned
        self._protected_tokens += pinned
        self._repeated_locked_tokens += repeated
        self._locked_path_tokens += locked

    def unlock(self, node: TreeNode, now: float) -> None:
        """Undo one `lock(node)`: lock_ref -= 1 along root..node, last_access_s = now. Nodes that
        reach lock_ref 0 become evictable. ValueError (and no change) if a count would go negative."""
        path = []
        n = node
        while n.parent is not None:
            if n.lock_ref <= 0:
                raise ValueError(f"unlock of {node} without a matching lock")
            path.append(n)
            n = n.parent
        locked = freed = repeated = 0
        for n in path:
            size = len(n.key)
            locked += size
            n.last_access_s = now
            ref = n.lock_ref - 1
            n.lock_ref = ref
            if ref == 0:
                freed += size
            else:
                repeated += size
        self._locked_path_tokens -= locked
        self._protected_tokens -= freed
        self._evictable_tokens += freed
        self._repeated_locked_tokens -= repeated
        if path:
            self._queue.push(path[0])  # only the deepest node can be a leaf

    # -- eviction -------------------------------------------------------------------------------
    def evict(self, num_tokens: int, now: float) -> int:
        """Evict unlocked leaves in the policy's order until >= num_tokens are freed or nothing is
        evictable; their slots go back to the allocator. A parent left as an unlocked leaf becomes
        a candidate. Returns tokens evicted (may exceed num_tokens). evict(0) is a no-op."""
        return sum(self.evict_leaves(num_tokens, now))

    def evict_leaves(self, num_tokens: int, now: float) -> list[int]:
        """`evict`, returning the tokens of each leaf evicted, in order. Several calls with nothing
        else changing the tree in between pop the same leaves as one call for their sum would:
        the first leaves whose tokens reach each call's running total."""
        sizes: list[int] = []
        num_evicted = 0
        freed: list[np.ndarray] = []
        while num_evicted < num_tokens:
            leaf = self._queue.pop()
            if leaf is None:
                break
            freed.append(leaf.slots)
            sizes.append(self._remove_leaf(leaf))
            num_evicted += sizes[-1]
        if freed:   # one call; last evicted first, so the free stack ends as with one call per leaf
            self.allocator.free_parts(freed[::-1])
        return sizes

    def reset(self) -> None:
        """Drop every cached prefix, freeing its slots to the allocator. ValueError if any node is
        locked (running requests still use the cache). Do not also reset the allocator first."""
        if self._protected_tokens:
            raise ValueError(f"reset with {self._protected_tokens} tokens still locked")
        parts = [np.empty(0, dtype=SLOT_DTYPE)]
        for node in self.iter_nodes():
            parts.append(node.slots)
            node.evicted = True
        self.allocator.free_parts(parts)
        self._clear_tree()

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every node except the root, parents before children (for checks and statistics)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # -- internals ------------------------------------------------------------------------------
    def _new_node(self, parent: TreeNode | None, key: list[int], slots: np.ndarray, now: float,
                  priority: int) -> TreeNode:
        node = TreeNode(self._next_node_id, parent, key, slots, now, priority)
        self._next_node_id += 1
        return node

    def _aligned_key(self, token_ids: Sequence[int]) -> Sequence[int]:
        aligned_len = len(token_ids) - len(token_ids) % self.page_size
        if type(token_ids) in TOKEN_SEQUENCES:
            return token_ids if aligned_len == len(token_ids) else token_ids[:aligned_len]
        return list(token_ids[:aligned_len])

    def _matched_len(self, key: list[int], pos: int, child: TreeNode, end: int | None = None) -> int:
        matched = common_prefix_len(key, pos, child.key, end)
        return matched - matched % self.page_size

    def _add_leaf(self, parent: TreeNode, key: list[int], slots: np.ndarray, now: float,
                  priority: int, hit_count: int = 0) -> TreeNode:
        leaf = self._new_node(parent, key, slots, now, priority)
        leaf.hit_count = hit_count
        parent.children[edge_key(key, 0, self.page_size)] = leaf
        self.num_nodes += 1
        self._evictable_tokens += len(key)
        self._queue.push(leaf)             # after its stats are set: the queue reads the key now
        return leaf

    def _split(self, child: TreeNode, num_head_tokens: int) -> TreeNode:
        """Cut `child`'s edge after num_head_tokens (page-aligned, > 0). A new node takes the head
        and `child` keeps the tail, so nodes held by callers still end at the same depth."""
        parent = child.parent
        assert parent is not None and 0 < num_head_tokens < len(child.key)
        head = self._new_node(parent, child.key[:num_head_tokens], child.slots[:num_head_tokens],
                              child.created_s, child.priority)
        head.last_access_s = child.last_access_s
        head.hit_count = child.hit_count
        head.lock_ref = child.lock_ref
        parent.children[edge_key(child.key, 0, self.page_size)] = head
        child.key = child.key[num_head_tokens:]
        child.slots = child.slots[num_head_tokens:]
        child.parent = head
        head.children[edge_key(child.key, 0, self.page_size)] = child
        self.num_nodes += 1
        return head

    def _remove_leaf(self, leaf: TreeNode) -> int:
        """Unlink `leaf` (the caller frees its slots)."""
        parent = leaf.parent
        assert parent is not None and leaf.is_eviction_candidate()
        del parent.children[edge_key(leaf.key, 0, self.page_size)]
        leaf.parent = None
        leaf.evicted = True
        self.num_nodes -= 1
        self._evictable_tokens -= len(leaf.key)
        self._queue.push(parent)  # queued only if now an unlocked leaf (never the root)
        return len(leaf.key)
