"""ForwardBatch.from_plan (numpy path) against the per-token list builder it replaced, on mixed plans:
prefill chunks whose tokens straddle input and output ids, decodes whose kv_slots already end with the
new slots (the no-copy branch) or hold more slots than prefix + new (the slicing branch)."""
from __future__ import annotations

import random

import pytest

from experiments.bench_forward_batch import check_same, from_plan_lists
from runtime.core.batch import ForwardMode, ScheduledItem, StepPlan
from runtime.core.request import Request, SamplingParams
from runtime.engine.forward_batch import ForwardBatch


def random_plan(seed: int, num_items: int) -> StepPlan:
    rng = random.Random(seed)
    items, next_slot = [], 0
    for i in range(num_items):
        num_input, num_output = rng.randint(1, 40), rng.randint(0, 10)
        req = Request(f"r{i}", [rng.randrange(1000) for _ in range(num_input)], SamplingParams(), 0.0)
        req.output_ids = [rng.randrange(1000) for _ in range(num_output)]
        total = num_input + num_output
        decode = num_output > 0 and rng.random() < 0.5
        prefix = total - 1 if decode else rng.randint(0, total - 1)
        num_new = 1 if decode else rng.randint(1, total - prefix)
        slots = list(range(next_slot, next_slot + prefix + num_new))
        rng.shuffle(slots)
        next_slot += prefix + num_new + 3
        req.kv_slots = slots[:prefix] + (slots[prefix:] if rng.random() < 0.5 else [])
        if rng.random() < 0.3:
            req.append_kv_slots([next_slot - 1])            # a stale extra slot: must be ignored
        items.append(ScheduledItem(req, prefix, num_new, slots[prefix:], is_decode=decode, samples=True))
    return StepPlan(0, ForwardMode.MIXED, items)


@pytest.mark.parametrize("seed", range(6))
def test_from_plan_equals_list_builder(seed: int) -> None:
    plan = random_plan(seed, num_items=1 + seed * 3)
    check_same(ForwardBatch.from_plan(plan, "cpu"), from_plan_lists(plan, "cpu"))


def test_from_plan_rejects_missing_prefix_slots() -> None:
    plan = random_plan(0, 4)
    item = next(it for it in plan.items if it.num_prefix_tokens > 0)
    item.request.kv_slots = item.request.kv_slots[:item.num_prefix_tokens - 1]
    with pytest.raises(ValueError):
        ForwardBatch.from_plan(plan, "cpu")


def test_from_plan_rejects_new_slot_count_mismatch() -> None:
    plan = random_plan(1, 3)
    plan.items[0].new_slots = plan.items[0].new_slots + [999]
    with pytest.raises(ValueError):
        ForwardBatch.from_plan(plan, "cpu")
