"""StepLog: a decode run whose batch shrinks, recorded in one call (record_decode_steps), gives the rows
that recording each stretch of one batch with record_decode_run gives."""
from __future__ import annotations

import pytest

from runtime.core.batch import ForwardMode, ScheduledItem, StepPlan
from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec


def decode_plan(step_id: int, prefixes: list[int], retracted: list[str]) -> StepPlan:
    items = [ScheduledItem(Request.from_spec(RequestSpec(f"r{i}", 0.0, tuple(range(p)), 8)), p, 1, [0], True, True)
             for i, p in enumerate(prefixes)]
    return StepPlan(step_id, ForwardMode.DECODE, items, retracted_rids=retracted)


def test_a_shrinking_run_in_one_call_equals_its_stretches_one_by_one():
    plan = decode_plan(40, [10, 20, 30], ["gone"])
    context = sum(it.num_prefix_tokens + 1 for it in plan.items)          # 63
    starts, ends = [0.0, 1.0, 2.0, 3.5, 4.0], [1.0, 2.0, 3.5, 4.0, 4.25]
    used, running = [100, 103, 106, 108, 110], [3, 3, 2, 2, 1]
    # steps 0-1: all three; 2-3: the last two (context at the run's start 52); 4: the last one (31)
    stretches = [(plan, 0, 2, context, 3), (decode_plan(40, [20, 30], []), 2, 4, 52, 2),
                 (decode_plan(40, [30], []), 4, 5, 31, 1)]
    one_by_one = StepLog(predicted_from_duration=True)
    for batch, a, b, ctx, _ in stretches:
        one_by_one.record_decode_run(batch, starts[a:b], ends[a:b], used[a:b], 7, running[b - 1], step_offset=a,
                                     context_tokens=ctx)
    at_once = StepLog(predicted_from_duration=True)
    sizes = [n for _, a, b, _, n in stretches for _ in range(a, b)]
    contexts = [ctx + n * j for _, a, b, ctx, n in stretches for j in range(a, b)]
    at_once.record_decode_steps(plan, starts, ends, used, 7, running, sizes, contexts)
    assert at_once.columns == one_by_one.columns
    assert at_once.columns["num_retractions"] == [1, 0, 0, 0, 0]
    assert at_once.columns["decode_context_tokens"] == [63, 66, 56, 58, 35]


def test_plan_signatures_need_each_batch():
    log = StepLog()
    log.plan_signatures = []
    with pytest.raises(ValueError, match="plan signatures"):
        log.record_decode_steps(decode_plan(0, [5], []), [0.0], [1.0], [6], 0, [1], [1], [6])
