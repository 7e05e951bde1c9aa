"""Each schedule policy orders a hand-built queue as documented."""
from __future__ import annotations

from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.eviction.lru import LRUEviction
from runtime.core.cache.radix_cache import RadixCache
from runtime.core.kv_manager import KVManager
from runtime.core.policy.dfs_weight import DFSWeightPolicy
from runtime.core.policy.fcfs import FCFSPolicy
from runtime.core.policy.lof import LOFPolicy
from runtime.core.policy.lpm import LPMPolicy
from runtime.core.policy.priority import PriorityPolicy
from runtime.core.policy.random import RandomPolicy
from runtime.core.request import Request
from tests.core.harness import fake_tokens, make_scheduler, run_to_completion, spec


def req(rid, tokens, arrival=0.0, out=10, priority=0):
    return Request.from_spec(spec(rid, tokens, out, arrival_s=arrival, priority=priority))


def cache_with(*prefixes):
    alloc = KVSlotAllocator(10000)
    cache = RadixCache(alloc, LRUEviction())
    for p in prefixes:
        cache.insert(list(p), alloc.allocate(0, len(p), None), 0.0)
    kv = KVManager(alloc, cache)
    return kv.match


def rids(reqs):
    return [r.rid for r in reqs]


def test_fcfs_keeps_the_arrival_order_the_scheduler_keeps():
    queue = [req("a", [2], 1.0), req("b", [1], 2.0), req("c", [3], 3.0)]
    order = FCFSPolicy().order(queue, cache_with(), 0.0)
    assert rids(order) == ["a", "b", "c"] and order is not queue
    sched = make_scheduler(capacity=5000, chunked_prefill_size=0, max_prefill_tokens=2)
    for rid, arrival in (("late", 2.0), ("early", 1.0), ("mid", 1.5)):
        sched.add(req(rid, [7, 8], arrival, out=2), arrival)
    assert [r.rid for r in sched.waiting] == ["early", "mid", "late"]


def test_lpm_longest_cached_prefix_first_with_fcfs_ties():
    match = cache_with(range(100), range(1000, 1040))
    queue = [req("none", range(500, 560), 0.0), req("short", list(range(1000, 1040)) + [7], 1.0),
             req("long", list(range(100)) + [5], 2.0), req("none2", range(700, 760), 3.0)]
    assert rids(LPMPolicy().order(queue, match, 0.0)) == ["long", "short", "none", "none2"]


def test_lpm_falls_back_to_fcfs_on_long_queues():
    match = cache_with(range(100))
    queue = [req(f"r{i}", [9000 + i] * 3, float(i)) for i in range(5)] + [req("hit", list(range(100)) + [1], 9.0)]
    assert rids(LPMPolicy(max_queue_for_matching=3).order(queue, match, 0.0))[-1] == "hit"
    assert rids(LPMPolicy(max_queue_for_matching=10).order(queue, match, 0.0))[0] == "hit"


def test_in_batch_prefix_caching_moves_group_members_back():
    """SGLang schedule_policy.py SchedulePolicy._compute_prefix_matches / _sort_by_longest_prefix:
    requests sharing >= 32 tokens with an earlier short-match request are deprioritized (sorted
    last, arrival order among them), not removed: they are still tried this step."""
    shared = list(range(40))
    queue = [req("g1", shared + [1], 0.0), req("g2", shared + [2], 1.0), req("solo", range(500, 545), 2.0),
             req("g3", shared + [3], 3.0)]
    assert rids(LPMPolicy().order(queue, cache_with(), 0.0)) == ["g1", "solo", "g2", "g3"]
    assert rids(LPMPolicy(in_batch_prefix_threshold_tokens=0).order(queue, cache_with(), 0.0)) == \
        ["g1", "g2", "solo", "g3"]
    # a budget of two requests per step: the solo request runs beside g0, and g1, g2 hit g0's prefix
    specs = [spec(f"g{i}", shared + [i], 3) for i in range(3)] + [spec("solo", range(500, 545), 3)]
    for threshold, expected in ((32, [0, 0, 40, 40]), (0, [0, 0, 0, 40])):
        sched = make_scheduler(capacity=5000, policy=LPMPolicy(in_batch_prefix_threshold_tokens=threshold),
                               chunked_prefill_size=0, max_prefill_tokens=100)
        done, _ = run_to_completion(sched, specs)
        assert sorted(r.num_cached_tokens for r in done) == expected


def test_dfs_weight_visits_heaviest_subtree_first():
    a, b = list(range(100)), list(range(200, 300))
    match = cache_with(a, b)
    queue = [req("b1", b + [1], 0.0), req("a1", a + [1], 1.0), req("a2", a + [2], 2.0),
             req("a3", a + [3], 3.0), req("nomatch", range(900, 950), 4.0)]
    order = rids(DFSWeightPolicy().order(queue, match, 0.0))
    assert order[:3] == ["a1", "a2", "a3"] and order[3] == "b1" and order[4] == "nomatch"


def test_dfs_weight_has_no_hold_back_no_fcfs_fallback_and_breaks_ties_by_child_order():
    """SGLang schedule_policy.py: _determine_active_policy falls back to FCFS above 128 waiting
    requests for LPM only, dfs-weight ignores the in-batch deprioritization, and
    _get_dfs_priority sorts children by weight with a stable sort over the children dict
    (the order their first tokens entered the tree)."""
    late, early = list(range(300, 340)), list(range(100, 140))
    match = cache_with(late, early)                 # root's children: `late`, then `early`
    # matching late[:20] splits `late`: its head is a newer node in the older child's place
    queue = [req("early", early + [1], 0.0), req("late", late[:20] + [1], 1.0)]
    assert rids(DFSWeightPolicy().order(queue, match, 0.0)) == ["late", "early"]
    shared = list(range(900, 940))
    many = [req(f"s{i}", shared + [i], float(i)) for i in range(3)] + [req("hit", late + [2], 9.0)]
    order = rids(DFSWeightPolicy().order(many, match, 0.0))
    assert order == ["hit", "s0", "s1", "s2"]      # nothing held back; the matched subtree first
    long_queue = [req(f"r{i}", [5000 + i] * 3, float(i)) for i in range(200)] + [req("hit", late + [3], 999.0)]
    assert rids(DFSWeightPolicy().order(long_queue, match, 0.0))[0] == "hit"
    assert rids(DFSWeightPolicy(max_queue_for_matching=128).order(long_queue, match, 0.0))[0] == "r0"


def test_cache_aware_policies_become_fcfs_without_the_cache():
    """SGLang SchedulePolicy._validate_and_adjust_policy: lpm / dfs-weight with the radix cache
    disabled run as FCFS (so no in-batch hold-back either)."""
    shared = list(range(40))
    for policy in (LPMPolicy(), DFSWeightPolicy()):
        sched = make_scheduler(capacity=5000, policy=policy, cache_enabled=False)
        assert isinstance(sched.policy, FCFSPolicy)
        for i in range(3):
            sched.add(req(f"g{i}", shared + [i], float(i)), 0.0)
        plan = sched.schedule(0.0)
        assert [it.request.rid for it in plan.items] == ["g0", "g1", "g2"]
    assert make_scheduler(policy=LPMPolicy()).policy.__class__ is LPMPolicy


def test_lof_longest_output_first():
    queue = [req("s", [1], 0.0, out=5), req("l", [2], 1.0, out=500), req("m", [3], 2.0, out=50)]
    assert rids(LOFPolicy().order(queue, cache_with(), 0.0)) == ["l", "m", "s"]


def test_random_is_a_seeded_permutation():
    queue = [req(f"r{i}", [i], float(i)) for i in range(20)]
    one = rids(RandomPolicy(seed=7).order(queue, cache_with(), 0.0))
    two = rids(RandomPolicy(seed=7).order(queue, cache_with(), 0.0))
    assert one == two and sorted(one) == sorted(rids(queue)) and one != rids(queue)
    assert rids(RandomPolicy(seed=8).order(queue, cache_with(), 0.0)) != one


def test_priority_orders_by_priority_then_arrival():
    queue = [req("lo", [1], 0.0, priority=1), req("hi_early", [3], 1.0, priority=9), req("hi", [2], 2.0, priority=9)]
    assert rids(PriorityPolicy().order(queue, cache_with(), 0.0)) == ["hi_early", "hi", "lo"]
    assert rids(PriorityPolicy(low_value_first=True).order(queue, cache_with(), 0.0))[0] == "lo"


def test_priority_preempts_running_requests_below_the_threshold():
    sched = make_scheduler(capacity=300, policy=PriorityPolicy(preemption_threshold=10), chunked_prefill_size=0)
    sched.add(req("low", range(100), 0.0, out=100, priority=0), 0.0)
    plan = sched.schedule(0.0)
    sched.commit(plan, fake_tokens(plan), 0.001)
    sched.add(req("urgent", range(500, 600), 0.002, out=100, priority=50), 0.002)
    sched.add(req("meh", range(700, 800), 0.002, out=100, priority=5), 0.002)
    plan = sched.schedule(0.002)
    assert [it.request.rid for it in plan.items] == ["urgent"]
    assert [r.rid for r in sched.waiting] == ["low", "meh"] and sched.waiting[0].num_retractions == 1
