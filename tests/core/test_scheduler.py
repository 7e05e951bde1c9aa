"""Scheduler behaviour: nothing lost, overload retracts and recovers, chunking, budgets, ratio."""
from __future__ import annotations

import pytest

from runtime.core.batch import ForwardMode
from runtime.core.request import FinishReason, Request, RequestStatus
from tests.core.harness import check_invariants, make_scheduler, random_specs, run_to_completion, spec


def test_every_request_ends_with_a_reason():
    specs = random_specs(150, seed=1)
    sched = make_scheduler(capacity=6000, chunked_prefill_size=128, max_prefill_tokens=256)
    done, _ = run_to_completion(sched, specs)
    assert sorted(r.rid for r in done) == sorted(s.rid for s in specs)
    for req in done:
        assert req.finish_reason is FinishReason.LENGTH
        assert len(req.output_ids) == req.sampling.max_new_tokens
        assert req.first_token_s is not None and req.finish_s >= req.first_token_s
    alloc, cache = sched.kv.allocator, sched.kv.cache
    assert cache.protected_size() == 0
    assert alloc.num_free_slots + cache.evictable_size() == alloc.capacity_slots


@pytest.mark.parametrize("page_size", [1, 4])
def test_overload_at_three_times_capacity_retracts_and_finishes(page_size):
    # every request needs ~200 tokens of KV at its end; 60 of them want 3x the pool at once
    specs = [spec(f"r{i}", [i % 7] * 40 + list(range(i, i + 60)), 100) for i in range(60)]
    demand = sum(len(s.input_ids) + s.output_len for s in specs)
    capacity = demand // 3
    sched = make_scheduler(capacity=capacity, page_size=page_size)
    done, plans = run_to_completion(sched, specs)
    assert sched.num_retractions > 0
    assert sum(len(p.retracted_rids) for p in plans) == sched.num_retractions
    assert all(r.finish_reason is FinishReason.LENGTH for r in done) and len(done) == 60
    assert any(r.num_retractions > 0 for r in done)


def test_retraction_picks_fewest_outputs_then_longest_input_and_ratio_jumps():
    # no reservation for running requests, so all three get in and then outgrow the pool;
    # long_in and mid_in are admitted together (same output count): the longer input goes first
    sched = make_scheduler(capacity=420, chunked_prefill_size=0, init_new_token_ratio=0.0,
                           min_new_token_ratio_factor=0.0)
    specs = [spec("short_in", range(50), 100), spec("long_in", range(100, 190), 100, arrival_s=0.0005),
             spec("mid_in", range(200, 270), 100, arrival_s=0.0005)]
    retracted, ratio_after = [], []

    def watch(plan):
        retracted.extend(plan.retracted_rids)
        if plan.retracted_rids:
            ratio_after.append(sched.new_token_ratio)
    run_to_completion(sched, specs, on_plan=watch)
    assert retracted and retracted[0] == "long_in"
    assert ratio_after[0] > 0.0    # jumped back from 0 after the retraction


def test_chunked_prefill_splits_as_configured():
    sched = make_scheduler(capacity=20000, chunked_prefill_size=4096, max_prefill_tokens=16384)
    chunks = []
    run_to_completion(sched, [spec("big", range(10000), 2)],
                      on_plan=lambda p: chunks.extend(it.num_new_tokens for it in p.items if not it.is_decode))
    assert chunks == [4096, 4096, 1808]


def test_max_prefill_tokens_bounds_a_step_but_one_long_request_still_runs():
    sched = make_scheduler(capacity=50000, chunked_prefill_size=0, max_prefill_tokens=1000)
    specs = [spec(f"r{i}", range(i * 1000, i * 1000 + 400), 2) for i in range(5)] + [spec("long", range(9000, 12000), 2)]
    plans = []
    run_to_completion(sched, specs, on_plan=plans.append)
    prefill_steps = [p.num_prefill_tokens for p in plans if p.num_prefill_tokens]
    assert 3000 in prefill_steps
    assert all(t <= 1000 for t in prefill_steps if t != 3000)


def test_max_running_requests_is_respected():
    sched = make_scheduler(capacity=50000, max_running_requests=3)
    active = []

    def watch(plan):
        holding = {id(it.request) for it in plan.items} | {id(r) for r in sched.running}
        active.append(len(holding))
    run_to_completion(sched, random_specs(20, seed=3), on_plan=watch)
    assert max(active) == 3


def test_decode_batches_every_running_request_and_ratio_decays():
    sched = make_scheduler(capacity=50000, new_token_ratio_decay_steps=10)
    ratios = []
    plans = []

    def watch(plan):
        plans.append(plan)
        ratios.append(sched.new_token_ratio)
    run_to_completion(sched, [spec(f"r{i}", range(i, i + 30), 40) for i in range(4)], on_plan=watch)
    decode = [p for p in plans if p.mode is ForwardMode.DECODE]
    assert decode[0].batch_size == 4
    decaying = [r for p, r in zip(plans, ratios) if p.mode is ForwardMode.DECODE]
    # the floor is init x 0.14 = 0.098 (SGLang managers/scheduler.py Scheduler.__init__:
    # min_new_token_ratio = init_new_token_ratio * default_min_new_token_ratio_factor)
    assert decaying[0] < 0.7 and min(decaying) == pytest.approx(0.7 * 0.14)


def test_mixed_chunk_mode_runs_prefill_and_decode_together():
    sched = make_scheduler(capacity=50000, enable_mixed_chunk=True)
    specs = [spec("a", range(100), 50), spec("b", range(200, 300), 5, arrival_s=0.01)]
    plans = []
    run_to_completion(sched, specs, on_plan=plans.append)
    mixed = [p for p in plans if p.mode is ForwardMode.MIXED]
    assert mixed and mixed[0].num_decode_requests == 1 and mixed[0].num_prefill_tokens == 100


def test_too_long_requests_abort_with_reason():
    sched = make_scheduler(capacity=100)
    sched.add(Request.from_spec(spec("huge", range(200), 5)), 0.0)
    (req,) = sched.pop_finished()
    assert req.status is RequestStatus.ABORTED and req.finish_reason is FinishReason.TOO_LONG


def test_abort_frees_kv_and_ends_request():
    sched = make_scheduler(capacity=5000)
    for s in [spec("a", range(50), 100), spec("b", range(100, 150), 100)]:
        sched.add(Request.from_spec(s), 0.0)
    plan = sched.schedule(0.0)
    from tests.core.harness import fake_tokens
    sched.commit(plan, fake_tokens(plan), 0.001)
    sched.abort("a")
    plan = sched.schedule(0.002)
    aborted = sched.pop_finished()
    assert [r.rid for r in aborted] == ["a"] and aborted[0].finish_reason is FinishReason.ABORT
    assert [it.request.rid for it in plan.items] == ["b"]
    sched.commit(plan, fake_tokens(plan), 0.003)
    check_invariants(sched)


def test_prefix_is_cached_after_prefill_and_hit_by_the_next_request():
    sched = make_scheduler(capacity=5000)
    shared = list(range(300))
    specs = [spec("first", shared + [1, 2, 3], 3), spec("second", shared + [4, 5], 3, arrival_s=0.0005)]
    done, _ = run_to_completion(sched, specs)
    second = next(r for r in done if r.rid == "second")
    assert second.num_cached_tokens == 300


def test_disabled_cache_never_hits():
    sched = make_scheduler(capacity=5000, cache_enabled=False)
    shared = list(range(300))
    done, _ = run_to_completion(sched, [spec("a", shared + [1], 3), spec("b", shared + [2], 3, arrival_s=0.01)])
    assert all(r.num_cached_tokens == 0 for r in done)
    assert sched.kv.allocator.num_free_slots == 5000


def _blocked_queue_scheduler():
    """A request decoding and a waiting one whose cached prefix it matches but which does not fit."""
    from runtime.core.policy.lpm import LPMPolicy
    from tests.core.harness import fake_tokens
    sched = make_scheduler(capacity=700, chunked_prefill_size=0, policy=LPMPolicy())
    prefix = list(range(100))
    sched.add(Request.from_spec(spec("p", prefix + [1], 1)), 0.0)
    plan = sched.schedule(0.0)
    sched.commit(plan, fake_tokens(plan), 0.01)               # p ends; its prefix stays cached
    sched.pop_finished()
    sched.add(Request.from_spec(spec("run", range(1000, 1200), 300)), 0.01)
    plan = sched.schedule(0.01)
    sched.commit(plan, fake_tokens(plan), 0.02)
    sched.add(Request.from_spec(spec("w", prefix + list(range(2000, 2250)), 100)), 0.02)
    return sched, prefix


def test_a_decode_run_replays_the_touches_of_its_admission_attempts():
    """Each schedule() of a decode run tries to admit the waiting request, matching (touching)
    its cached prefix (SGLang's _match_prefix_helper); a coalesced run leaves the same access
    time as stepping: that of its last schedule()."""
    stepped, prefix = _blocked_queue_scheduler()
    ff, _ = _blocked_queue_scheduler()
    plan = ff.schedule(0.02)
    k = ff.decode_run_bound(plan, 8, 0.02)
    assert plan.mode is ForwardMode.DECODE and k >= 3
    ends = [0.02 + 0.01 * (j + 1) for j in range(k)]
    ff.commit_decode_run(plan, ends, [[5] * k for _ in plan.items])
    check_invariants(ff)                          # the running reservation sum followed the run
    from tests.core.harness import fake_tokens
    now = 0.02
    for _ in range(k):
        plan = stepped.schedule(now)
        now += 0.01
        stepped.commit(plan, fake_tokens(plan), now)
    touched = [s.kv.cache.match_prefix(prefix).node.last_access_s for s in (stepped, ff)]
    assert touched[0] == pytest.approx(0.02 + 0.01 * (k - 1)) and touched[1] == pytest.approx(touched[0])


def test_a_chunked_prefill_counts_one_lfu_hit_not_one_per_chunk():
    """SGLang: intermediate chunks call cache_unfinished_req(chunked=True), which skips
    _inc_hit_count; the last chunk's insert and the finished request's insert count."""
    from runtime.core.cache.eviction.lfu import LFUEviction
    from tests.core.harness import fake_tokens
    sched = make_scheduler(capacity=2000, chunked_prefill_size=100, eviction=LFUEviction())
    tokens = list(range(250))
    sched.add(Request.from_spec(spec("r", tokens, 3)), 0.0)
    now, hits = 0.0, []
    while sched.has_work():
        plan = sched.schedule(now)
        now += 0.01
        sched.commit(plan, fake_tokens(plan), now)
        hits.append(sched.kv.cache.match_prefix(tokens[:100]).node.hit_count)
    assert hits[:3] == [0, 0, 1] and hits[-1] == 2     # two unfinished chunks, the last, the finish


def _draining_scheduler():
    """Three requests with a shared prefix, admitted together, then decoding with 3, 5 and 9
    tokens left: nothing waits, so a decode run may span the first two finishes."""
    sched = make_scheduler(capacity=2000, chunked_prefill_size=0)
    prefix = list(range(50))
    for rid, out in (("a", 4), ("b", 6), ("c", 10)):
        sched.add(Request.from_spec(spec(rid, prefix + [100 + ord(rid)] * 20, out)), 0.0)
    from tests.core.harness import fake_tokens
    plan = sched.schedule(0.0)
    sched.commit(plan, fake_tokens(plan), 0.01)
    return sched


def test_a_decode_run_spans_finishes_exactly_as_stepping():
    """With nothing waiting, a finish only shrinks the batch (its KV goes to the radix cache at its
    own step's end), so one run covers all nine steps; every request, the KV pool, the cache and
    the reservation end as stepping leaves them."""
    from tests.core.harness import fake_tokens
    stepped, ff = _draining_scheduler(), _draining_scheduler()
    plan = ff.schedule(0.01)
    k = ff.decode_run_bound(plan, 64, 0.01)
    assert k == 9                                  # the longest request's tokens, past two finishes
    ends = [0.01 + 0.01 * (j + 1) for j in range(k)]
    tokens = [[(len(it.request.output_ids) + j) * 7 % 500 + 1 for j in range(k)] for it in plan.items]
    tokens = [t[:it.request.max_new_tokens_left] for t, it in zip(tokens, plan.items)]
    used_ff = ff.commit_decode_run(plan, ends, tokens)
    used_stepped, now = [], 0.01
    while stepped.running:
        plan = stepped.schedule(now)
        now += 0.01
        stepped.commit(plan, fake_tokens(plan), now)
        used_stepped.append(stepped.kv.used_tokens())
    assert used_ff == used_stepped
    done = {r.rid: r for r in stepped.pop_finished()}
    ended = ff.pop_finished()
    assert [r.rid for r in ended] == ["a", "b", "c"]
    for req in ended:
        twin = done[req.rid]
        assert req.output_ids == twin.output_ids and req.finish_s == pytest.approx(twin.finish_s)
        assert req.token_times_s == pytest.approx(twin.token_times_s)
    assert [r.finish_s for r in ended] == pytest.approx([0.04, 0.06, 0.1])
    for s in (stepped, ff):
        check_invariants(s)
    assert ff.step_id == stepped.step_id and ff.new_token_ratio == stepped.new_token_ratio
    assert ff.kv.cache.evictable_size() == stepped.kv.cache.evictable_size()
    assert ff.kv.allocator.num_free_slots == stepped.kv.allocator.num_free_slots


def test_a_decode_run_ends_at_the_first_finish_while_requests_wait():
    """A waiting request blocked on memory may fit once a running one leaves (its KV becomes
    evictable, its reservation goes): the run stops at the first finish."""
    sched = _draining_scheduler()
    sched.add(Request.from_spec(spec("w", list(range(500, 2400)), 5)), 0.01)
    plan = sched.schedule(0.01)
    assert plan.mode is ForwardMode.DECODE and [r.rid for r in sched.waiting] == ["w"]
    assert sched.decode_run_bound(plan, 64, 0.01) == 3
    assert sched.decode_run_bound(plan, 64, 0.01, overlap=True) == 2
