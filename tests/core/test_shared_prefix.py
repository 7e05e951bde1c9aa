"""StepShape.decode_shared_tokens counts the KV slots a decode step's requests read more than once:
checked against the slots themselves (sum of each request's cache-held slots less the distinct ones)
after every step of scheduler runs with shared system prompts, at page sizes 1 and 4."""
from __future__ import annotations

import pytest

from runtime.core.shared_prefix import shared_prefix_tokens
from sim.costmodel.base import StepShape
from tests.core.harness import make_scheduler, random_specs, run_to_completion, spec


def repeated_slots(requests) -> int:
    held = [slot for r in requests for slot in r.kv_slots[:r.num_locked_prefix_tokens].tolist()]
    return len(held) - len(set(held))


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shared_tokens_are_the_repeated_cache_slots_of_every_step(page_size, seed):
    specs = random_specs(60, seed=seed, num_groups=3, prefix_len=64)
    checked = []

    def check(plan):
        decodes = [it.request for it in plan.items if it.is_decode]
        shape = StepShape.from_plan(plan)
        assert shape.decode_shared_tokens == repeated_slots(decodes) == shared_prefix_tokens(decodes)
        checked.append(shape.decode_shared_tokens)

    run_to_completion(make_scheduler(capacity=8192, page_size=page_size), specs, on_plan=check)
    assert max(checked) > 0                       # the groups' prompts were shared at some step


def test_one_group_shares_its_prompt_once_per_extra_reader():
    prefix = list(range(100, 148))                                # 48 tokens
    specs = [spec(f"r{i}", prefix + [200 + i, 300 + i], output_len=8) for i in range(5)]
    shapes = []
    run_to_completion(make_scheduler(), specs,
                      on_plan=lambda plan: shapes.append(StepShape.from_plan(plan)) if plan.items[0].is_decode else None)
    assert shapes and all(s.num_decode_reqs == 5 for s in shapes[:3])
    assert shapes[0].decode_shared_tokens == 4 * 48               # 4 requests read the first one's 48 slots


def test_requests_without_cached_prefixes_share_nothing():
    specs = [spec(f"r{i}", [i * 50 + k for k in range(20)], output_len=4) for i in range(4)]
    shared = []
    run_to_completion(make_scheduler(cache_enabled=False), specs,
                      on_plan=lambda plan: shared.append(StepShape.from_plan(plan).decode_shared_tokens))
    assert set(shared) == {0}


@pytest.mark.parametrize("overlap", [False, True])
def test_decode_runs_count_each_batch_as_stepping_would(tmp_path, monkeypatch, overlap):
    """Fast-forwarded decode runs shrink their batch at each finish: the shared tokens each shrunken
    batch is priced with (counted from the cache's lock counts) equal a fresh walk of its requests,
    and the records equal stepping's (the stored summaries of shared-prefix workloads pin the rest)."""
    from experiments.compose import compose_config
    from sim.app import run_sim
    from sim.executor import SimExecutor

    durations = SimExecutor.decode_groups_durations_s
    priced: list[int] = []

    def checked(self, groups, ends):
        for group in groups:
            plan = group.plan
            assert group.num_reqs == len(plan.items)
            assert group.shared_tokens is None or group.shared_tokens == plan.decode_shared_tokens
            assert plan.decode_shared_tokens == shared_prefix_tokens(it.request for it in plan.items)
            # the run's own lengths: the items' at its first step
            assert group.context_lens.tolist() == [it.context_tokens for it in plan.items]
            assert group.context_tokens == sum(it.context_tokens for it in plan.items)
            if group.first_step:
                priced.append(plan.decode_shared_tokens)
        return durations(self, groups, ends)

    monkeypatch.setattr(SimExecutor, "decode_groups_durations_s", checked)
    overrides = ["progress=false", "print_summary=false", "workload=shared_prefix", "workload.num_groups=3",
                 "workload.prompts_per_group=12", "workload.output_len=48", "workload.range_ratio=0.5",
                 f"overlap={overlap}"]
    run_sim(compose_config(overrides), out_dir=tmp_path / "run")
    assert len(priced) >= 5 and max(priced) > 0     # batches past a finish, still sharing prefixes
