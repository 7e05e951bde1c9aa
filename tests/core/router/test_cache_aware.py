"""Cache-aware routing (sglang-router's policy): cache affinity while balanced, smallest tree
for unmatched prompts, least-loaded fallback past both imbalance thresholds, LRU eviction of
the approximate trees on the clock passed in."""
from __future__ import annotations

import random
from array import array

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runtime.core.router.approx_tree import ApproxPrefixTree
from runtime.core.router.cache_aware import CacheAwareRouter
from tests.core.router.specs import distinct, spec

PREFIX_A = list(range(1, 201))          # two system prompts of 200 tokens
PREFIX_B = list(range(1001, 1201))


def test_tree_takes_prompts_of_any_sequence_type_without_copying() -> None:
    tree = ApproxPrefixTree()
    tree.insert(array("i", [1, 2, 3, 4, 5]), now=0.0)     # an int32 prompt (Mooncake's)
    tree.insert((1, 2, 9), now=1.0)                        # a tuple splits its edge
    assert tree.match_len([1, 2, 3, 4, 6]) == 4 and tree.match_len(array("i", [1, 2, 9, 9])) == 3
    assert tree.size_tokens == 6


def test_tree_matches_inserts_and_splits() -> None:
    tree = ApproxPrefixTree()
    tree.insert([1, 2, 3, 4, 5], now=0.0)
    tree.insert([1, 2, 9], now=1.0)                 # splits the first edge after [1, 2]
    assert tree.size_tokens == 6
    assert tree.match_len([1, 2, 3, 4, 5, 6]) == 5
    assert tree.match_len([1, 2, 9, 9]) == 3
    assert tree.match_len([1, 2, 3, 7]) == 3
    assert tree.match_len([7]) == 0 and tree.match_len([]) == 0
    tree.insert([1, 2, 3], now=2.0)                 # already there: size unchanged
    assert tree.size_tokens == 6


def test_tree_evicts_least_recently_used_leaves_first() -> None:
    tree = ApproxPrefixTree()
    tree.insert([1, 2, 3, 4], now=0.0)
    tree.insert([1, 2, 7, 8], now=5.0)
    tree.insert([9, 9, 9], now=1.0)
    assert tree.size_tokens == 9
    assert tree.evict_to(7) == 2                    # [3, 4] (t=0) goes, not [9, 9, 9] (t=1)
    assert tree.match_len([1, 2, 3, 4]) == 2 and tree.match_len([9, 9, 9]) == 3
    tree.evict_to(0)
    assert tree.size_tokens == 0 and tree.match_len([1, 2, 7, 8]) == 0


def test_tree_size_is_sum_of_distinct_tokens_under_random_inserts() -> None:
    rng = random.Random(0)
    tree, stored = ApproxPrefixTree(), []
    for t in range(200):
        seq = tuple(rng.randrange(3) for _ in range(rng.randrange(1, 12)))
        tree.insert(seq, now=float(t))
        stored.append(seq)
    prefixes = {s[:i] for s in stored for i in range(1, len(s) + 1)}
    assert tree.size_tokens == len(prefixes)        # one token per distinct non-empty prefix
    for s in stored:
        assert tree.match_len(s) == len(s)


def test_cache_affinity_keeps_a_prefix_on_its_replica() -> None:
    router = CacheAwareRouter(num_replicas=2)
    first_a = router.route(spec("a0", PREFIX_A + [5000]), now=0.0)
    first_b = router.route(spec("b0", PREFIX_B + [5001]), now=0.0)
    assert {first_a, first_b} == {0, 1}             # unmatched: smallest tree, i.e. the empty one
    for i in range(1, 20):
        assert router.route(spec(f"a{i}", PREFIX_A + [6000 + i]), now=0.0) == first_a
        assert router.route(spec(f"b{i}", PREFIX_B + [7000 + i]), now=0.0) == first_b
    assert router.num_routed_by_cache == 38 and router.num_balanced_by_load == 0


def test_low_match_goes_to_the_smallest_tree() -> None:
    router = CacheAwareRouter(num_replicas=2, cache_threshold=0.5)
    router.route(spec("big", list(range(1000))), now=0.0)            # replica 0, 1000 tokens
    router.route(spec("small", list(range(5000, 5010))), now=0.0)    # replica 1, 10 tokens
    router.finish(0)
    router.finish(1)
    # shares 100 of 400 tokens with replica 0: 0.25 <= 0.5, so the smaller tree wins
    assert router.route(spec("weak", list(range(100)) + list(range(9000, 9300))), now=0.0) == 1
    # shares 300 of 400: above the threshold, replica 0
    assert router.route(spec("strong", list(range(300)) + list(range(9500, 9600))), now=0.0) == 0


@pytest.mark.parametrize("abs_threshold,rel_threshold,expect_fallback", [
    (4, 1.5, True),      # both thresholds passed: least loaded
    (100, 1.5, False),   # absolute gap not passed: still cache affinity
    (4, 50.0, False),    # relative gap not passed: still cache affinity
])
def test_imbalance_fallback_needs_both_thresholds(abs_threshold, rel_threshold, expect_fallback) -> None:
    router = CacheAwareRouter(num_replicas=2, balance_abs_threshold=abs_threshold,
                              balance_rel_threshold=rel_threshold)
    home = router.route(spec("a0", PREFIX_A + [1]), now=0.0)
    other = 1 - home
    router.route(distinct(0), now=0.0)              # the other replica gets one request
    for i in range(1, 6):                           # pile the shared prefix onto `home`
        router.route(spec(f"a{i}", PREFIX_A + [100 + i]), now=0.0)
    counts = router.in_flight.counts
    assert counts[home] == 6 and counts[other] == 1
    pick = router.route(spec("a_next", PREFIX_A + [999]), now=0.0)
    assert pick == (other if expect_fallback else home)
    assert router.num_balanced_by_load == int(expect_fallback)


def test_balanced_load_by_finishing_requests_restores_affinity() -> None:
    router = CacheAwareRouter(num_replicas=2, balance_abs_threshold=2, balance_rel_threshold=1.5)
    home = router.route(spec("a0", PREFIX_A + [1]), now=0.0)
    for i in range(1, 4):
        router.route(spec(f"a{i}", PREFIX_A + [10 + i]), now=0.0)
    assert router.route(spec("x", PREFIX_A + [50]), now=0.0) == 1 - home   # 4 vs 0: fallback
    for _ in range(3):
        router.finish(home)
    assert router.route(spec("y", PREFIX_A + [60]), now=0.0) == home       # 1 vs 1: affinity


def test_trees_are_evicted_on_the_interval_of_now() -> None:
    router = CacheAwareRouter(num_replicas=2, eviction_interval_s=10.0, max_tree_size_tokens=150)
    home = router.route(spec("a0", PREFIX_A), now=0.0)
    router.finish(home)
    assert router.trees[home].size_tokens == 200
    router.route(distinct(1, length=8), now=9.0)    # before the interval: nothing evicted
    assert router.trees[home].size_tokens == 200
    router.route(distinct(2, length=8), now=10.0)   # interval reached: trimmed to <= 150
    assert router.trees[home].size_tokens <= 150


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="cache_threshold"):
        CacheAwareRouter(num_replicas=2, cache_threshold=1.5)
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        CacheAwareRouter(num_replicas=2, balance_rel_threshold=0.5)


def test_yaml_builds_it_with_sglang_router_defaults() -> None:
    router = instantiate(OmegaConf.load("conf/router/cache_aware.yaml"))(num_replicas=3)
    assert isinstance(router, CacheAwareRouter) and router.num_replicas == 3
    assert (router.cache_threshold, router.balance_abs_threshold, router.balance_rel_threshold) == (0.3, 64, 1.5)
