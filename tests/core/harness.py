"""Test harness: build a scheduler on a small KV pool and step it with a fake executor, checking
the scheduler's invariants after every step."""
from __future__ import annotations

import random

from runtime.core.batch import StepPlan, StepResult
from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.eviction.lru import LRUEviction
from runtime.core.cache.radix_cache import RadixCache
from runtime.core.kv_manager import KVManager
from runtime.core.policy.fcfs import FCFSPolicy
from runtime.core.request import Request, RequestSpec, RequestStatus
from runtime.core.scheduler import Scheduler
from runtime.core.scheduler_config import SchedulerConfig


def make_scheduler(capacity: int = 4096, policy=None, page_size: int = 1, cache_enabled: bool = True,
                   eviction=None, **config) -> Scheduler:
    alloc = KVSlotAllocator(capacity, page_size)
    cache = RadixCache(alloc, eviction or LRUEviction(), page_size, enabled=cache_enabled)
    return Scheduler(SchedulerConfig(**config), policy or FCFSPolicy(), KVManager(alloc, cache))


def spec(rid: str, tokens, output_len: int, arrival_s: float = 0.0, priority: int = 0) -> RequestSpec:
    return RequestSpec(rid, arrival_s, tuple(tokens), output_len, priority=priority)


def random_specs(num: int, seed: int = 0, max_input: int = 300, max_output: int = 60,
                 num_groups: int = 4, prefix_len: int = 100) -> list[RequestSpec]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(500) for _ in range(prefix_len)] for _ in range(num_groups)]
    out = []
    for i in range(num):
        body = [rng.randrange(500) for _ in range(rng.randint(1, max_input))]
        tokens = (prefixes[rng.randrange(num_groups)] + body) if rng.random() < 0.7 else body
        out.append(spec(f"r{i:04d}", tokens, rng.randint(1, max_output), arrival_s=i * 0.001))
    return out


def fake_tokens(plan: StepPlan) -> StepResult:
    return StepResult([(len(it.request.output_ids) * 7 + 1) % 500 for it in plan.sampling_items], 0.001)


def check_invariants(sched: Scheduler) -> None:
    """Slot conservation and queue consistency; raises AssertionError on any violation."""
    kv, alloc, cache = sched.kv, sched.kv.allocator, sched.kv.cache
    active = list(sched.running) + ([sched.chunked] if sched.chunked else [])
    page = alloc.page_size
    private_pages = set()
    for req in active:
        assert len(req.kv_slots) == req.num_computed_tokens
        private_pages.update((req.kv_slots[req.num_locked_prefix_tokens:] // page).tolist())
    private = len(private_pages) * page
    total = alloc.num_free_slots + private + cache.evictable_size() + cache.protected_size()
    assert total == alloc.capacity_slots, (alloc.num_free_slots, private, cache.evictable_size(),
                                           cache.protected_size(), alloc.capacity_slots)
    for req in sched.waiting:
        assert req.status is RequestStatus.WAITING and req.num_kv_slots == 0 and req.cache_node is None
    for req in sched.running:
        assert req.status is RequestStatus.DECODING
        assert req.num_computed_tokens == req.num_fill_tokens - 1
    clip = sched.config.clip_max_new_tokens
    assert sched.reserved_running_tokens == sum(
        min(r.sampling.max_new_tokens - len(r.output_ids), clip) for r in sched.running)
    ids = [id(r) for r in sched.waiting + active]
    assert len(ids) == len(set(ids)), "a request is queued twice"
    arrivals = [r.arrival_s for r in sched.waiting]
    assert arrivals == sorted(arrivals)


def run_to_completion(sched: Scheduler, specs: list[RequestSpec], max_steps: int = 100_000,
                      on_plan=None) -> tuple[list[Request], list[StepPlan]]:
    """Step the scheduler (all arrivals at their times, fake 1 ms steps) until everything ends."""
    now, pending, done, plans = 0.0, sorted(specs, key=lambda s: s.arrival_s), [], []
    for _ in range(max_steps):
        while pending and pending[0].arrival_s <= now:
            sched.add(Request.from_spec(pending.pop(0)), now)
        plan = sched.schedule(now)
        if plan is None:
            done += sched.pop_finished()
            if not pending and not sched.has_work():
                return done, plans
            assert pending, "scheduler stalled"
            now = pending[0].arrival_s
            continue
        if on_plan:
            on_plan(plan)
        plans.append(plan)
        result = fake_tokens(plan)
        now += result.duration_s
        sched.commit(plan, result, now)
        check_invariants(sched)
        done += sched.pop_finished()
    raise AssertionError("did not finish")
