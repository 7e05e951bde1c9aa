"""Each eviction policy evicts in its documented order; hits are counted; YAMLs instantiate."""
from __future__ import annotations

from pathlib import Path

import pytest

from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.eviction.base import EvictionPolicy
from runtime.core.cache.eviction.fifo import FIFOEviction
from runtime.core.cache.eviction.filo import FILOEviction
from runtime.core.cache.eviction.lfu import LFUEviction
from runtime.core.cache.eviction.lru import LRUEviction
from runtime.core.cache.eviction.mru import MRUEviction
from runtime.core.cache.eviction.priority import PriorityEviction
from runtime.core.cache.eviction.slru import SLRUEviction
from runtime.core.cache.radix_cache import RadixCache
from tests.core.cache.tree_checks import check_tree

CONF_DIR = Path(__file__).resolve().parents[3] / "conf" / "eviction"


def insert(cache: RadixCache, tokens: list[int], now: float, priority: int = 0, count_hit: bool = True) -> None:
    slots = cache.allocator.allocate(0, len(tokens), None)
    cache.allocator.free(slots[:cache.insert(tokens, slots, now, priority, count_hit)])


def hit(cache: RadixCache, tokens: list[int], now: float) -> None:
    """One request reusing `tokens`: match and lock, then at its end insert its tokens (counts a
    hit on the path, as SGLang's cache_finished_req) and unlock, all at `now`."""
    match = cache.match_prefix(tokens, now=now)
    cache.lock(match.node, now)
    cache.insert(tokens, match.slots, now)
    cache.unlock(match.node, now)


def eviction_order(cache: RadixCache, names: dict[str, list[int]]) -> list[str]:
    """Evict one leaf at a time and report which named sequence disappeared."""
    order = []
    while cache.total_size():
        present = {name for name, tokens in names.items() if cache.match_prefix(tokens).length}
        assert cache.evict(1, now=100.0) > 0, "evictable tokens left but nothing was evicted"
        check_tree(cache)
        order += sorted(name for name in present if not cache.match_prefix(names[name]).length)
    return order


def four_leaves(policy: EvictionPolicy) -> tuple[RadixCache, dict[str, list[int]]]:
    """Leaves with stats (created, last access, hits, priority) chosen so every policy differs:
    A (1, 12, 4, 0), B (2, 15, 2, 5), C (3, 20, 1, 1), D (4, 8, 3, 0) (the first insert counts)."""
    cache = RadixCache(KVSlotAllocator(64), policy)
    names = {"A": [0, 0], "B": [1, 1], "C": [2, 2], "D": [3, 3]}
    for created_s, (name, priority) in enumerate([("A", 0), ("B", 5), ("C", 1), ("D", 0)], start=1):
        insert(cache, names[name], float(created_s), priority)
    for now in (7.0, 8.0):
        hit(cache, names["D"], now)
    for now in (10.0, 11.0, 12.0):
        hit(cache, names["A"], now)
    hit(cache, names["B"], 15.0)
    insert(cache, names["C"], 20.0, count_hit=False)   # an unfinished chunk's insert touches, counts no hit
    return cache, names


@pytest.mark.parametrize("policy, expected", [
    (LRUEviction(), "DABC"),
    (MRUEviction(), "CBAD"),
    (FIFOEviction(), "ABCD"),
    (FILOEviction(), "DCBA"),
    (LFUEviction(), "CBDA"),
    (SLRUEviction(protected_hits=3), "BCDA"),
    (PriorityEviction(), "DACB"),
])
def test_each_policy_evicts_in_its_documented_order(policy: EvictionPolicy, expected: str) -> None:
    cache, names = four_leaves(policy)
    assert "".join(eviction_order(cache, names)) == expected


def test_lfu_keeps_a_frequently_hit_node_that_lru_would_evict() -> None:
    for policy, survivor in ((LFUEviction(), "hot"), (LRUEviction(), "recent")):
        cache = RadixCache(KVSlotAllocator(64), policy)
        insert(cache, [1, 1, 1], now=1.0)
        for now in (2.0, 3.0, 4.0):
            hit(cache, [1, 1, 1], now)
        insert(cache, [2, 2, 2], now=10.0)
        assert cache.match_prefix([1, 1, 1]).node.hit_count == 4     # its insert and three reuses
        cache.evict(1, now=11.0)
        names = {"hot": [1, 1, 1], "recent": [2, 2, 2]}
        assert [n for n, t in names.items() if cache.match_prefix(t).length] == [survivor]


def test_hits_are_counted_on_the_whole_inserted_path() -> None:
    """SGLang's RadixCache._insert_helper: every node of an inserted path counts one hit."""
    cache = RadixCache(KVSlotAllocator(64), LFUEviction())
    insert(cache, [1, 2, 3], now=1.0)
    insert(cache, [1, 2, 4], now=2.0)            # splits [1, 2, 3]: the head keeps its hit, +1
    hit(cache, [1, 2, 3], now=3.0)
    hit(cache, [1, 2, 4], now=4.0)
    assert cache.match_prefix([1, 2]).node.hit_count == 4
    assert cache.match_prefix([1, 2, 3]).node.hit_count == 2


def test_lock_counts_no_hit_and_chunked_inserts_count_none() -> None:
    """SGLang counts LFU hits at insert (RadixCache._inc_hit_count), not in inc_lock_ref, and
    skips the inserts of unfinished chunks (cache_unfinished_req(chunked=True)): one request
    prefilled in three chunks counts one hit, not three."""
    cache = RadixCache(KVSlotAllocator(64), LFUEviction())
    tokens = list(range(12))
    slots = cache.allocator.allocate(0, 12, None)
    for end in (4, 8):                            # two unfinished chunks
        cache.insert(tokens[:end], slots[:end], now=float(end), count_hit=False)
        node = cache.match_prefix(tokens[:end]).node
        cache.lock(node, now=float(end))
        cache.unlock(node, now=float(end))
    cache.insert(tokens, slots, now=12.0)         # the last chunk completes the prefill
    assert [n.hit_count for n in (cache.match_prefix(tokens[:k]).node for k in (4, 8, 12))] == [1, 1, 1]


def test_match_refreshes_access_time_so_lru_keeps_prefixes_waiting_requests_match() -> None:
    """SGLang's RadixCache._match_prefix_helper sets last_access_time on every node it walks: a
    prefix that waiting requests keep matching is not the LRU victim."""
    cache = RadixCache(KVSlotAllocator(64), LRUEviction())
    insert(cache, [1, 1, 1], now=1.0)
    insert(cache, [2, 2, 2], now=2.0)
    assert cache.match_prefix([1, 1, 1, 9], now=3.0).length == 3
    cache.match_prefix([2, 2, 2], now=None)      # a check without `now` touches nothing
    cache.evict(1, now=4.0)
    assert cache.match_prefix([1, 1, 1]).length == 3 and cache.match_prefix([2, 2, 2]).length == 0


def test_match_touches_both_halves_of_a_split_node() -> None:
    cache = RadixCache(KVSlotAllocator(64), LRUEviction())
    insert(cache, [1, 2, 3, 4], now=1.0)
    insert(cache, [5, 5], now=2.0)
    head = cache.match_prefix([1, 2, 9], now=3.0).node      # ends inside [1, 2, 3, 4]
    assert head.last_access_s == 3.0 and next(iter(head.children.values())).last_access_s == 3.0
    assert cache.evict(1, now=4.0) == 2 and cache.match_prefix([5, 5]).length == 0


@pytest.mark.parametrize("num_hits, evicted_first", [(1, "old"), (2, "new")])
def test_slru_protects_a_node_after_three_hits(num_hits: int, evicted_first: str) -> None:
    cache = RadixCache(KVSlotAllocator(64), SLRUEviction(protected_hits=3))
    insert(cache, [1, 1], now=1.0)                              # the insert counts one hit
    for i in range(num_hits):
        hit(cache, [1, 1], now=2.0 + i)
    insert(cache, [2, 2], now=10.0)
    hit(cache, [2, 2], now=11.0)                                # two hits: still probationary
    names = {"old": [1, 1], "new": [2, 2]}
    assert eviction_order(cache, names)[0] == evicted_first


def test_priority_evicts_low_priority_first_even_if_recent() -> None:
    cache = RadixCache(KVSlotAllocator(64), PriorityEviction())
    insert(cache, [1, 1], now=1.0, priority=3)
    insert(cache, [2, 2], now=5.0, priority=0)
    insert(cache, [3, 3], now=2.0, priority=0)
    hit(cache, [3, 3], now=9.0)
    names = {"high": [1, 1], "low_recent": [2, 2], "low_hit_later": [3, 3]}
    assert eviction_order(cache, names) == ["low_recent", "low_hit_later", "high"]


def test_lock_raises_a_nodes_priority_to_the_requests() -> None:
    cache = RadixCache(KVSlotAllocator(64), PriorityEviction())
    insert(cache, [1, 1], now=1.0, priority=0)
    insert(cache, [2, 2], now=2.0, priority=1)
    node = cache.match_prefix([1, 1]).node
    cache.lock(node, now=3.0, priority=7)
    cache.unlock(node, now=3.0)
    assert eviction_order(cache, {"boosted": [1, 1], "other": [2, 2]}) == ["other", "boosted"]


def test_priority_eviction_clamps_priorities_into_its_range() -> None:
    """Priorities outside [0, 99] (SGLang's range for priority eviction) rank as the nearest
    bound, so LRU decides among them; a wider range keeps them apart."""
    for policy, expected in ((PriorityEviction(), ["huge", "huger"]),
                             (PriorityEviction(min_priority=None, max_priority=None), ["huger", "huge"])):
        cache = RadixCache(KVSlotAllocator(64), policy)
        insert(cache, [1, 1], now=1.0, priority=1000)
        insert(cache, [2, 2], now=2.0, priority=500)
        order = eviction_order(cache, {"huge": [1, 1], "huger": [2, 2]})
        assert order == expected
    assert PriorityEviction().clamped(-5) == 0 and PriorityEviction().clamped(7) == 7
    with pytest.raises(ValueError):
        PriorityEviction(min_priority=5, max_priority=1)


def test_ties_break_by_node_id() -> None:
    cache = RadixCache(KVSlotAllocator(64), LRUEviction())
    for first_token in (3, 1, 2):
        insert(cache, [first_token, 0], now=1.0)
    names = {str(t): [t, 0] for t in (1, 2, 3)}
    assert eviction_order(cache, names) == ["3", "1", "2"]


def test_slru_rejects_a_bad_threshold() -> None:
    with pytest.raises(ValueError):
        SLRUEviction(protected_hits=0)


@pytest.mark.parametrize("name, cls", [
    ("lru", LRUEviction), ("mru", MRUEviction), ("fifo", FIFOEviction), ("filo", FILOEviction),
    ("lfu", LFUEviction), ("slru", SLRUEviction), ("priority", PriorityEviction),
])
def test_every_yaml_instantiates_its_policy(name: str, cls: type) -> None:
    hydra_utils = pytest.importorskip("hydra.utils")
    omegaconf = pytest.importorskip("omegaconf")
    policy = hydra_utils.instantiate(omegaconf.OmegaConf.load(CONF_DIR / f"{name}.yaml"))
    assert type(policy) is cls
    assert cls.__module__.rsplit(".", 1)[-1] == name
    if cls is SLRUEviction:
        assert policy.protected_hits == 2
    if cls is PriorityEviction:
        assert (policy.min_priority, policy.max_priority) == (0, 99)
