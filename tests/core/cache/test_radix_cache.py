"""RadixCache: match/insert/split semantics, paging, locking, eviction bookkeeping, disabled mode."""
from __future__ import annotations

import pytest

from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.eviction.lru import LRUEviction
from runtime.core.cache.radix_cache import RadixCache
from tests.core.cache.tree_checks import check_tree, path_tokens_and_slots


def make_cache(num_slots: int = 256, page_size: int = 1, enabled: bool = True) -> RadixCache:
    allocator = KVSlotAllocator(num_slots, page_size)
    return RadixCache(allocator, LRUEviction(), page_size=page_size, enabled=enabled)


def cache_sequence(cache: RadixCache, tokens: list[int], now: float, priority: int = 0) -> list[int]:
    """What a finished request does: compute everything, insert, free duplicates and the tail."""
    slots = cache.allocator.allocate(0, len(tokens), None)
    already = cache.insert(tokens, slots, now, priority)
    aligned = len(tokens) - len(tokens) % cache.page_size
    cache.allocator.free(slots[:already] + slots[aligned:])
    return slots


def test_match_on_empty_cache_returns_root() -> None:
    cache = make_cache()
    match = cache.match_prefix([1, 2, 3])
    assert (match.length, match.slots, match.node) == (0, [], cache.root)


def test_insert_then_match_returns_the_stored_slots() -> None:
    cache = make_cache()
    slots = cache_sequence(cache, [1, 2, 3, 4], now=1.0)
    match = cache.match_prefix([1, 2, 3, 4, 5])
    assert (match.length, match.slots) == (4, slots)
    assert cache.match_prefix((1, 2, 3)).slots == slots[:3]      # tuples work too
    check_tree(cache)


def test_insert_reports_the_already_present_prefix() -> None:
    cache = make_cache()
    first = cache_sequence(cache, [1, 2, 3, 4], now=1.0)
    slots = cache.allocator.allocate(0, 6, None)
    assert cache.insert([1, 2, 9, 9, 9, 9], slots, now=2.0) == 2
    assert cache.insert([1, 2, 3, 4], first, now=3.0) == 4
    assert cache.insert([], [], now=3.0) == 0
    cache.allocator.free(slots[:2])
    match = cache.match_prefix([1, 2, 9, 9, 9, 9])
    assert match.slots == first[:2] + slots[2:]
    assert cache.total_size() == 8
    check_tree(cache)


def test_insert_requires_one_slot_per_token() -> None:
    cache = make_cache()
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], [0, 1], now=0.0)


def test_match_splits_so_the_node_ends_at_the_match_length() -> None:
    cache = make_cache()
    slots = cache_sequence(cache, [5, 6, 7, 8, 9], now=1.0)
    leaf = cache.match_prefix([5, 6, 7, 8, 9]).node
    match = cache.match_prefix([5, 6, 7, 0])
    assert match.length == 3 and match.node.key == [5, 6, 7] and match.slots == slots[:3]
    assert leaf.parent is match.node and leaf.key == [8, 9]    # the held node keeps its depth
    assert path_tokens_and_slots(leaf) == ([5, 6, 7, 8, 9], slots)
    assert cache.total_size() == 5 and cache.num_nodes == 2
    check_tree(cache)


def test_long_keys_match_with_mismatch_anywhere() -> None:
    cache = make_cache(num_slots=4096)
    base = list(range(1000))
    cache_sequence(cache, base, now=1.0)
    for cut in (0, 1, 17, 500, 998, 999):
        probe = base[:cut] + [-1] + base[cut + 1:]
        assert cache.match_prefix(probe).length == cut
    assert cache.match_prefix(base + [7]).length == 1000
    check_tree(cache)


def test_page_size_four_matches_whole_pages_only() -> None:
    cache = make_cache(page_size=4)
    tokens = list(range(10))
    slots = cache_sequence(cache, tokens, now=1.0)            # 8 tokens cached, 2-token tail freed
    assert cache.total_size() == 8
    assert cache.match_prefix(tokens).length == 8
    assert cache.match_prefix(tokens[:7]).length == 4
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).length == 4   # mismatch inside page 2
    assert cache.match_prefix([0, 1, 2]).length == 0
    assert cache.match_prefix(tokens).slots == slots[:8]
    assert cache.allocator.num_free_slots == cache.allocator.capacity_slots - 8
    check_tree(cache)


def test_page_size_four_separates_pages_that_differ_late() -> None:
    cache = make_cache(page_size=4)
    a = cache_sequence(cache, [1, 1, 1, 1, 2, 2, 2, 2], now=1.0)
    b = cache_sequence(cache, [1, 1, 1, 1, 2, 2, 2, 3], now=2.0)
    assert cache.match_prefix([1, 1, 1, 1, 2, 2, 2, 2]).slots == a
    assert cache.match_prefix([1, 1, 1, 1, 2, 2, 2, 3]).slots == a[:4] + b[4:]
    assert cache.total_size() == 12 and cache.num_nodes == 3
    check_tree(cache)


def test_disabled_cache_always_misses_and_stores_nothing() -> None:
    cache = make_cache(enabled=False)
    slots = cache.allocator.allocate(0, 3, None)
    assert cache.insert([1, 2, 3], slots, now=1.0) == 0
    match = cache.match_prefix([1, 2, 3])
    assert (match.length, match.slots, match.node) == (0, [], cache.root)
    cache.lock(match.node, now=1.0)
    cache.unlock(match.node, now=2.0)
    assert cache.total_size() == 0 and cache.evict(10, now=3.0) == 0
    assert cache.allocator.num_free_slots == cache.allocator.capacity_slots - 3   # caller still owns them


def test_lock_moves_tokens_to_protected_and_blocks_eviction() -> None:
    cache = make_cache()
    cache_sequence(cache, [1, 2, 3], now=1.0)
    cache_sequence(cache, [1, 2, 4, 5], now=2.0)
    node = cache.match_prefix([1, 2, 3]).node
    cache.lock(node, now=3.0)
    assert (cache.protected_size(), cache.evictable_size()) == (3, 2)
    assert cache.evict(100, now=4.0) == 2
    assert cache.match_prefix([1, 2, 3]).length == 3 and cache.match_prefix([1, 2, 4]).length == 2
    cache.unlock(node, now=5.0)
    assert (cache.protected_size(), cache.evictable_size()) == (0, 3)
    assert cache.evict(1, now=6.0) == 1                       # the leaf [3] first ...
    assert cache.evict(1, now=6.0) == 2                       # ... then its parent [1, 2] becomes a leaf
    assert cache.total_size() == 0
    assert cache.allocator.num_free_slots == cache.allocator.capacity_slots
    check_tree(cache)


def test_unlock_without_lock_raises_and_changes_nothing() -> None:
    cache = make_cache()
    cache_sequence(cache, [1, 2, 3], now=1.0)
    node = cache.match_prefix([1, 2, 3]).node
    with pytest.raises(ValueError):
        cache.unlock(node, now=2.0)
    assert node.lock_ref == 0 and cache.evictable_size() == 3
    check_tree(cache)


def test_locking_an_evicted_node_raises() -> None:
    cache = make_cache()
    cache_sequence(cache, [1, 2, 3], now=1.0)
    node = cache.match_prefix([1, 2, 3]).node
    cache.evict(3, now=2.0)
    with pytest.raises(ValueError, match="evicted"):
        cache.lock(node, now=3.0)


def test_evict_zero_and_empty_are_safe() -> None:
    cache = make_cache()
    assert cache.evict(0, now=0.0) == 0 and cache.evict(5, now=0.0) == 0
    cache_sequence(cache, [1, 2, 3], now=1.0)
    assert cache.evict(0, now=2.0) == 0 and cache.total_size() == 3


def test_eviction_may_exceed_the_request_by_a_whole_leaf() -> None:
    cache = make_cache()
    cache_sequence(cache, list(range(10)), now=1.0)
    assert cache.evict(1, now=2.0) == 10


def test_reset_frees_all_cached_slots() -> None:
    cache = make_cache(page_size=2, num_slots=64)
    cache_sequence(cache, [1, 2, 3, 4], now=1.0)
    cache_sequence(cache, [1, 2, 5, 6, 7], now=2.0)
    old_node = cache.match_prefix([1, 2]).node
    cache.reset()
    assert cache.total_size() == 0 and cache.num_nodes == 0 and old_node.evicted
    assert cache.allocator.num_free_slots == cache.allocator.capacity_slots
    assert cache.match_prefix([1, 2]).length == 0
    check_tree(cache)


def test_reset_with_locked_nodes_raises() -> None:
    cache = make_cache()
    cache_sequence(cache, [1, 2], now=1.0)
    cache.lock(cache.match_prefix([1, 2]).node, now=2.0)
    with pytest.raises(ValueError):
        cache.reset()


def test_page_size_must_match_the_allocator() -> None:
    with pytest.raises(ValueError):
        RadixCache(KVSlotAllocator(16, page_size=4), LRUEviction(), page_size=1)


def test_node_ids_are_per_cache_and_monotonic() -> None:
    first, second = make_cache(), make_cache()
    cache_sequence(first, [1, 2], now=1.0)
    cache_sequence(second, [1, 2], now=1.0)
    assert first.match_prefix([1, 2]).node.node_id == second.match_prefix([1, 2]).node.node_id
    cache_sequence(first, [1, 3], now=2.0)
    ids = [n.node_id for n in first.iter_nodes()]
    assert len(set(ids)) == len(ids) and min(ids) > first.root.node_id


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("as_tuple", [False, True])
def test_max_tokens_caps_the_match(page_size: int, as_tuple: bool) -> None:
    cache = make_cache(page_size=page_size)
    tokens = list(range(12))
    slots = cache_sequence(cache, tokens, now=1.0)
    probe = tuple(tokens) if as_tuple else tokens
    for max_tokens in (0, 1, 4, 5, 11, 12, 100):
        expected = min(max_tokens, 12) - min(max_tokens, 12) % page_size
        match = cache.match_prefix(probe, max_tokens=max_tokens)
        assert (match.length, match.slots) == (expected, slots[:expected])
        assert path_tokens_and_slots(match.node) == (tokens[:expected], slots[:expected])
    assert probe == (tuple(tokens) if as_tuple else tokens)            # the caller's sequence is untouched
    check_tree(cache)


@pytest.mark.parametrize("page_size", [1, 4])
def test_insert_path_from_a_known_node_equals_inserting_from_the_root(page_size: int) -> None:
    """Starting from a node the caller holds touches the same path and gives the same tree."""
    trees = []
    for from_node in (False, True):
        cache = RadixCache(KVSlotAllocator(256, page_size), LRUEviction(), page_size)
        tokens = list(range(40))
        slots = cache.allocator.allocate(0, 40, None)
        cache.insert(tokens[:16], slots[:16], now=1.0)
        held = cache.match_prefix(tokens[:16])
        already, node = cache.insert_path(tokens, slots, now=2.0, priority=3,
                                          start=held if from_node else None)
        assert already == 16 and node is cache.match_prefix(tokens).node
        trees.append(sorted((n.key[0], len(n.key), n.last_access_s, n.hit_count, n.priority) for n in cache.iter_nodes()))
    assert trees[0] == trees[1]


def test_path_slots_gathers_only_the_asked_range() -> None:
    cache = RadixCache(KVSlotAllocator(64), LRUEviction())
    slots = cache.allocator.allocate(0, 30, None)
    cache.insert(list(range(30)), slots, now=1.0)
    cache.insert(list(range(10)) + [99] * 5, slots[:10] + cache.allocator.allocate(0, 5, None), now=1.0)  # split at 10
    node = cache.match_prefix(list(range(30))).node
    assert cache.path_slots(node, 30, 5, 25).tolist() == slots[5:25]
    assert cache.path_slots(node, 30, 0, 30).tolist() == cache.match_prefix(list(range(30))).slots == slots


@pytest.mark.parametrize("page_size", [1, 4])
def test_insert_with_key_offset_equals_insert_with_the_whole_key(page_size: int) -> None:
    """A caller holding a prefix passes only the tokens past it (a request's outputs past its
    prompt): the tree ends the same as when it is given every token."""
    trees = []
    for offset in (0, 8):
        cache = make_cache(page_size=page_size)
        head = list(range(8))
        slots = cache.allocator.allocate(0, 8, None)
        cache.insert(head, slots, now=1.0)
        start = cache.match_prefix(head)
        tail = [50, 51, 52, 53, 54, 55, 56, 57, 58]
        more = slots + cache.allocator.allocate(8, len(tail), slots[-1])
        key = (head + tail)[offset:]
        already, node = cache.insert_path(key, more, now=2.0, num_tokens=16, start=start, key_offset=offset)
        assert already == 8 and cache.match_prefix(head + tail).length == 16
        check_tree(cache)
        trees.append(sorted((tuple(path_tokens_and_slots(n)[0]), tuple(path_tokens_and_slots(n)[1]))
                            for n in cache.iter_nodes()))
    assert trees[0] == trees[1]
    with pytest.raises(ValueError, match="key_offset"):
        make_cache().insert_path([1, 2], [0, 1, 2, 3], now=0.0, num_tokens=4, key_offset=2)


@pytest.mark.parametrize("page_size", [1, 4])
def test_one_eviction_frees_as_one_call_per_leaf_would(page_size: int) -> None:
    """Evicting several leaves at once hands their slots back in one allocator call; the free
    stack must end as if each leaf had been freed on its own, in eviction order."""
    def evict_all(batched: bool) -> list[int]:
        cache = make_cache(num_slots=64, page_size=page_size)
        for i, first in enumerate((1, 2, 3)):     # three disjoint prompts: three leaves
            cache_sequence(cache, [first] * 8 + list(range(10 * first, 10 * first + 8)), now=float(i))
        if batched:
            assert cache.evict(cache.evictable_size(), now=9.0) == 48
        else:
            while (leaf := cache._queue.pop()) is not None:
                cache.allocator.free(leaf.slots)
                cache._remove_leaf(leaf)
        return cache.allocator.allocate(0, 64 // page_size * page_size, None)
    assert evict_all(batched=True) == evict_all(batched=False)


def test_evicting_step_by_step_pops_the_leaves_one_call_for_the_sum_pops() -> None:
    """What decode runs rely on: evictions one step at a time (each for the slots its step lacks)
    free the first leaves whose sizes reach each running total, as one eviction for the total does."""
    def filled() -> RadixCache:
        cache = make_cache(num_slots=64)
        for i, length in enumerate([5, 3, 8, 2, 6, 4]):
            cache_sequence(cache, [100 * i + t for t in range(length)], now=float(i))
        return cache

    one, stepped = filled(), filled()
    sizes = one.evict_leaves(17, now=9.0)
    assert sizes == [5, 3, 8, 2] and one.evictable_size() == 10        # LRU: oldest leaves first, whole leaves
    deficits, freed = [4, 9, 12, 17], 0
    for deficit in deficits:                                           # each step evicts what it still lacks
        freed += stepped.evict(deficit - freed, now=9.0) if deficit > freed else 0
    assert freed == sum(sizes) and stepped.evictable_size() == one.evictable_size()
    assert sorted(n.key[0] for n in stepped.iter_nodes()) == sorted(n.key[0] for n in one.iter_nodes())
