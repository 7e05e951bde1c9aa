"""The prefill budget pinned to SGLang's PrefillAdder (managers/schedule_policy.py): strict
comparisons, the last chunk's decode reservation, page-aligned first chunks."""
from __future__ import annotations

from runtime.core.admission import PrefillBudget
from runtime.core.request import Request
from runtime.core.scheduler_config import SchedulerConfig
from tests.core.harness import make_scheduler, run_to_completion, spec


def req(rid: str, num_tokens: int, max_new: int, first: int = 0) -> Request:
    return Request.from_spec(spec(rid, range(first, first + num_tokens), max_new))


def budget(capacity: int = 1000, page_size: int = 1, **config) -> PrefillBudget:
    sched = make_scheduler(capacity=capacity, page_size=page_size, **config)
    return PrefillBudget(SchedulerConfig(**config), sched.kv, [], new_token_ratio=0.7)


def test_a_request_exactly_filling_the_kv_budget_is_rejected():
    """PrefillAdder.add_one_req: `if total_tokens >= self.rem_total_tokens: return NO_TOKEN`."""
    b = budget(capacity=1000)
    assert not b.fits(req("exact", 500, 500), prefix_tokens=0)
    assert b.fits(req("one_less", 500, 499), prefix_tokens=0)
    assert b.take_new(req("exact", 500, 500), nothing_else_runs=False) == 0
    assert b.take_new(req("one_less", 500, 499), nothing_else_runs=False) == 500


def test_a_second_request_exactly_filling_max_prefill_tokens_is_rejected():
    """PrefillAdder.add_one_req: `if input_tokens >= self.rem_input_tokens and
    len(self.can_run_list) != 0: return OTHER` (the first request of a step always runs)."""
    for second, admitted in ((40, ["a"]), (39, ["a", "b"])):
        sched = make_scheduler(capacity=5000, chunked_prefill_size=0, max_prefill_tokens=100)
        sched.add(req("a", 60, 4), 0.0)
        sched.add(req("b", second, 4, first=1000), 0.0)
        assert [it.request.rid for it in sched.schedule(0.0).items] == admitted


def test_the_last_chunk_reserves_its_decode_tokens():
    """PrefillAdder.add_chunked_req reserves min(max_new_tokens, CLIP_MAX_NEW_TOKENS) when the
    chunk is the request's last (`if not truncated`), so a request that only fits without that
    reservation waits instead of being admitted and retracted later."""
    b = budget(capacity=1000, chunked_prefill_size=100)
    long_req = req("long", 150, 400)
    long_req.num_computed_tokens = 100                        # as if its first chunk ran
    before = b.rem_total_tokens()
    assert b.take_chunk(long_req) == 50
    assert before - b.rem_total_tokens() == 50 + 400
    sched = make_scheduler(capacity=1000, chunked_prefill_size=100)
    sched.add(req("long", 150, 400), 0.0)
    plan = sched.schedule(0.0)
    assert [(it.request.rid, it.num_new_tokens) for it in plan.items] == [("long", 100)]
    sched.commit(plan, type("R", (), {"next_token_ids": []})(), 0.001)
    sched.add(req("next", 300, 200, first=5000), 0.001)    # 500 tokens: fits 850, not 450
    plan = sched.schedule(0.001)
    assert [(it.request.rid, it.num_new_tokens) for it in plan.items] == [("long", 50)]


def test_a_truncated_first_chunk_is_page_aligned():
    """PrefillAdder.add_one_req: `trunc_len = self.rem_chunk_tokens // self.page_size *
    self.page_size`; continuing chunks are not re-aligned (add_chunked_req)."""
    sched = make_scheduler(capacity=4000, page_size=4, chunked_prefill_size=10)
    chunks: list[int] = []
    run_to_completion(sched, [spec("r", range(25), 2)],
                      on_plan=lambda p: chunks.extend(it.num_new_tokens for it in p.items if not it.is_decode))
    assert chunks == [8, 10, 7]


def test_a_chunk_that_cannot_be_page_aligned_is_not_started():
    """trunc_len <= 0 after alignment: return OTHER (the request waits for a fresh chunk budget)."""
    b = budget(capacity=1000, page_size=4, chunked_prefill_size=3)
    assert b.take_new(req("r", 40, 4), nothing_else_runs=True) == 0


def test_budget_checks_do_not_mutate_the_request():
    b = budget(capacity=1000)
    r = req("r", 100, 10)
    b.fits(r, prefix_tokens=60, newly_protected_tokens=5)
    assert r.num_computed_tokens == 0 and r.num_kv_slots == 0
