"""Test helpers: recount a RadixCache from scratch and check its structure against its counters."""
from __future__ import annotations

from runtime.core.cache.radix_cache import RadixCache
from runtime.core.cache.tree_node import TreeNode, edge_key


def path_tokens_and_slots(node: TreeNode) -> tuple[list[int], list[int]]:
    """Concatenated key and slots from the root down to `node`."""
    parts = []
    while node.parent is not None:
        parts.append(node)
        node = node.parent
    tokens: list[int] = []
    slots: list[int] = []
    for part in reversed(parts):
        tokens.extend(part.key)
        slots.extend(part.slots.tolist())
    return tokens, slots


def cached_prefixes(cache: RadixCache) -> dict[tuple[int, ...], list[int]]:
    """Every page-aligned prefix stored in the tree -> its slots (computed by a plain walk)."""
    out: dict[tuple[int, ...], list[int]] = {(): []}
    stack = [(cache.root, [], [])]
    while stack:
        node, tokens, slots = stack.pop()
        for child in node.children.values():
            for end in range(cache.page_size, len(child.key) + 1, cache.page_size):
                out[tuple(tokens + child.key[:end])] = slots + child.slots[:end].tolist()
            stack.append((child, tokens + child.key, slots + child.slots.tolist()))
    return out


def reference_match(cache: RadixCache, tokens: list[int]) -> tuple[int, list[int]]:
    """Longest cached page-aligned prefix of `tokens`, by brute force over `cached_prefixes`."""
    prefixes = cached_prefixes(cache)
    ps = cache.page_size
    for length in range(len(tokens) - len(tokens) % ps, -1, -ps):
        if tuple(tokens[:length]) in prefixes:
            return length, prefixes[tuple(tokens[:length])]
    raise AssertionError("the empty prefix is always cached")


def check_tree(cache: RadixCache) -> None:
    """Structure, sizes, allocation state and eviction-queue liveness, recounted from scratch."""
    ps = cache.page_size
    evictable = protected = num_nodes = locked_path = repeated = 0
    for node in cache.iter_nodes():
        num_nodes += 1
        locked_path += len(node.key) * node.lock_ref
        repeated += len(node.key) * max(node.lock_ref - 1, 0)
        parent = node.parent
        assert parent is not None and not node.evicted
        assert parent.children[edge_key(node.key, 0, ps)] is node
        assert len(node.key) > 0 and len(node.key) % ps == 0
        assert len(node.slots) == len(node.key)
        assert node.lock_ref >= 0
        if parent is not cache.root:
            assert parent.lock_ref >= node.lock_ref, "a locked node's ancestors are locked"
        if node.lock_ref == 0:
            evictable += len(node.key)
        else:
            protected += len(node.key)
        for slot in node.slots.tolist():
            assert cache.allocator.is_allocated(slot)
    assert cache.root.lock_ref == 0 and cache.root.key == []
    assert (evictable, protected, num_nodes) == (cache.evictable_size(), cache.protected_size(), cache.num_nodes)
    assert cache.total_size() == evictable + protected
    assert (locked_path, repeated) == (cache.locked_path_tokens(), cache.repeated_locked_tokens())
    check_queue_is_live(cache)


def check_queue_is_live(cache: RadixCache) -> None:
    """Every eviction candidate has a live queue entry whose key equals its current policy key."""
    live = {}
    for key, _, version, node in cache._queue._heap:
        if version == node.queue_version and node.is_eviction_candidate():
            assert node.node_id not in live, "two live entries for one node"
            live[node.node_id] = key
    for node in cache.iter_nodes():
        if node.is_eviction_candidate():
            assert live.get(node.node_id) == cache.eviction.priority_key(node), f"stale or missing entry for {node}"
