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


def insert(cache: RadixCache, tokens: list[int], now: float, priority: int = 0) -> None:
    slots = cache.allocator.allocate(0, len(tokens), None)
    cache.allocator.free(slots[:cache.insert(tokens, slots, now, priority)])


def hit(cache: RadixCache, tokens: list[int], now: float) -> None:
    """One request reusing `tokens`: lock (counts a hit) then unlock at the same time."""
    node = cache.match_prefix(tokens).node
    cache.lock(node, now)
    cache.unlock(node, now)


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
    A (1, 12, 3, 0), B (2, 15, 1, 5), C (3, 20, 0, 1), D (4, 8, 2, 0)."""
    cache = RadixCache(KVSlotAllocator(64), policy)
    names = {"A": [0, 0], "B": [1, 1], "C": [2, 2], "D": [3, 3]}
    for created_s, (name, priority) in enumerate([("A", 0), ("B", 5), ("C", 1), ("D", 0)], start=1):
        insert(cache, names[name], float(created_s), priority)
    for now in (7.0, 8.0):
        hit(cache, names["D"], now)
    for now in (10.0, 11.0, 12.0):
        hit(cache, names["A"], now)
    hit(cache, names["B"], 15.0)
    insert(cache, names["C"], 20.0)             # re-inserting touches C without counting a hit
    return cache, names


@pytest.mark.parametrize("policy, expected", [
    (LRUEviction(), "DABC"),
    (MRUEviction(), "CBAD"),
    (FIFOEviction(), "ABCD"),
    (FILOEviction(), "DCBA"),
    (LFUEviction(), "CBDA"),
    (SLRUEviction(protected_hits=2), "BCDA"),
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
        assert cache.match_prefix([1, 1, 1]).node.hit_count == 3
        cache.evict(1, now=11.0)
        names = {"hot": [1, 1, 1], "recent": [2, 2, 2]}
        assert [n for n, t in names.items() if cache.match_prefix(t).length] == [survivor]


def test_hits_are_counted_on_the_whole_locked_path() -> None:
    cache = RadixCache(KVSlotAllocator(64), LFUEviction())
    insert(cache, [1, 2, 3], now=1.0)
    insert(cache, [1, 2, 4], now=2.0)
    hit(cache, [1, 2, 3], now=3.0)
    hit(cache, [1, 2, 4], now=4.0)
    assert cache.match_prefix([1, 2]).node.hit_count == 2
    assert cache.match_prefix([1, 2, 3]).node.hit_count == 1


@pytest.mark.parametrize("num_hits, evicted_first", [(1, "old"), (2, "new")])
def test_slru_protects_a_node_after_two_hits(num_hits: int, evicted_first: str) -> None:
    cache = RadixCache(KVSlotAllocator(64), SLRUEviction(protected_hits=2))
    insert(cache, [1, 1], now=1.0)
    for i in range(num_hits):
        hit(cache, [1, 1], now=2.0 + i)
    insert(cache, [2, 2], now=10.0)
    hit(cache, [2, 2], now=11.0)                                # one hit: still probationary
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
