"""The cache-aware router's approximate prefix tree of one replica: the token sequences routed
there, not the replica's real radix cache (the router never sees that), with LRU leaf eviction.

Must not import torch, simpy or time: access times are the `now` passed in.
"""
from __future__ import annotations

import heapq
from array import array
from typing import Sequence


class _Node:
    __slots__ = ("key", "children", "parent", "last_access_s")

    def __init__(self, key: Sequence[int], parent: "_Node | None", now: float) -> None:
        self.key = key                          # edge label: the tokens from parent to here
        self.children: dict[int, _Node] = {}    # first token of the child's key -> child
        self.parent = parent
        self.last_access_s = now


def _common_len(key: Sequence[int], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of `key` and tokens[start:] (sequences of one type, or compared as lists)."""
    n = min(len(key), len(tokens) - start)
    head, segment = key[:n], tokens[start:start + n]
    if type(head) is not type(segment):
        head, segment = list(head), list(segment)
    if segment == head:
        return n
    i = 0
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i


def _as_sequence(tokens: Sequence[int]) -> Sequence[int]:
    """A tuple, list or array as it is (edges are slices of it; prompts are never mutated), else a tuple."""
    return tokens if type(tokens) in (tuple, list, array) else tuple(tokens)


class ApproxPrefixTree:
    """Radix tree over token ids. `size_tokens` counts the tokens on all edges (what
    `max_tree_size` bounds, as sglang-router bounds characters per worker)."""

    def __init__(self) -> None:
        self.root = _Node((), None, 0.0)
        self.size_tokens = 0

    def match_len(self, tokens: Sequence[int]) -> int:
        """Tokens of the longest prefix of `tokens` stored in the tree; changes nothing."""
        tokens = _as_sequence(tokens)
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            common = _common_len(child.key, tokens, pos)
            pos += common
            if common < len(child.key):
                break
            node = child
        return pos

    def insert(self, tokens: Sequence[int], now: float) -> None:
        """Store `tokens`; every node on its path is stamped `now` (most recently used)."""
        tokens = _as_sequence(tokens)
        node, pos = self.root, 0
        node.last_access_s = now
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = _Node(tokens[pos:], node, now)
                node.children[tokens[pos]] = leaf
                self.size_tokens += len(leaf.key)
                return
            common = _common_len(child.key, tokens, pos)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access_s = now
            node, pos = child, pos + common

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child`'s edge after `at` tokens; returns the new upper node."""
        parent = child.parent
        upper = _Node(child.key[:at], parent, child.last_access_s)
        parent.children[upper.key[0]] = upper
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def evict_to(self, max_tokens: int) -> int:
        """Drop least-recently-used leaves until size_tokens <= max_tokens; returns tokens freed."""
        if self.size_tokens <= max_tokens:
            return 0
        freed, heap, order = 0, [], 0
        for leaf in self._leaves():
            heap.append((leaf.last_access_s, order, leaf))
            order += 1
        heapq.heapify(heap)
        while heap and self.size_tokens > max_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            self.size_tokens -= len(leaf.key)
            freed += len(leaf.key)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access_s, order, parent))
                order += 1
        return freed

    def _leaves(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out
