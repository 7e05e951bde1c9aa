"""The counting slot allocator (`kv.slot_allocator=counting`, mode=sim's default) against the paged
one: the same workloads give identical records (every request and step column), with evictions,
retractions, pages of several tokens, overlap on and off, and DP replicas."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.compose import compose_config
from runtime.build import build_core, slot_allocator_kind
from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.counting_allocator import CountingSlotAllocator
from sim.app import run_sim

QUIET = ["progress=false", "print_summary=false"]
RANDOM = ["workload=random", "workload.num_requests=60", "workload.request_rate=20",
          "workload.input_len=512", "workload.output_len=128"]
SHARED = ["workload=shared_prefix", "workload.num_groups=4", "workload.prompts_per_group=8", "workload.output_len=64"]

WORKLOADS = {
    "random_small_pool": RANDOM + ["kv.capacity_tokens=6000", "policy=lpm"],
    # a small reservation for future tokens: running requests outgrow the pool and are retracted
    "random_retracting": ["workload=random", "workload.num_requests=60", "workload.request_rate=inf",
                          "workload.input_len=256", "workload.output_len=512", "kv.capacity_tokens=6000",
                          "scheduler.init_new_token_ratio=0.1", "scheduler.new_token_ratio_decay_steps=20"],
    "random_fcfs_no_overlap": RANDOM + ["kv.capacity_tokens=12000", "policy=fcfs", "overlap=false"],
    "shared_prefix_evicting": SHARED + ["kv.capacity_tokens=3000", "policy=lpm", "costmodel=roofline"],
    "shared_prefix_pages_of_4": SHARED + ["kv.capacity_tokens=3000", "cache.page_size=4", "policy=lpm"],
    "random_no_fast_forward": RANDOM + ["kv.capacity_tokens=6000", "sim.fast_forward=false"],
    "dp2_cache_aware": SHARED + ["dp=2", "router=cache_aware", "kv.capacity_tokens=3000"],
}


def _run(tmp_path: Path, name: str, overrides: list[str]) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    out = tmp_path / name
    summary = run_sim(compose_config(QUIET + overrides), out_dir=out)
    return summary, pd.read_parquet(out / "requests.parquet"), pd.read_parquet(out / "steps.parquet")


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_counting_allocator_gives_the_paged_allocators_records(tmp_path, workload):
    overrides = WORKLOADS[workload]
    paged, req_paged, steps_paged = _run(tmp_path, "paged", overrides + ["kv.slot_allocator=paged"])
    counting, req_counting, steps_counting = _run(tmp_path, "counting", overrides + ["kv.slot_allocator=counting"])
    pd.testing.assert_frame_equal(req_counting, req_paged, check_exact=True)
    pd.testing.assert_frame_equal(steps_counting, steps_paged, check_exact=True)
    assert {k: v for k, v in counting.items() if k != "wall_time_s"} == {k: v for k, v in paged.items() if k != "wall_time_s"}
    assert counting["leaked_kv_slots"] == 0 and counting["num_finished"] == counting["num_requests"]


def test_the_workloads_exercise_eviction_and_retraction(tmp_path):
    """What the comparison covers: a pool that retracts requests, and cached prefixes evicted."""
    summary, _, _ = _run(tmp_path, "retracting", WORKLOADS["random_retracting"] + ["kv.slot_allocator=counting"])
    assert summary["num_retractions"] > 0
    for name in ("shared_prefix_evicting", "shared_prefix_pages_of_4"):
        summary, _, _ = _run(tmp_path, name, WORKLOADS[name] + ["kv.slot_allocator=counting"])
        assert 0 < summary["cache_hit_rate"] < 1


def test_auto_is_counting_in_mode_sim_and_paged_elsewhere():
    sim = compose_config(QUIET)
    assert slot_allocator_kind(sim) == "counting"
    assert isinstance(build_core(sim).scheduler.kv.allocator, CountingSlotAllocator)
    assert slot_allocator_kind(compose_config(QUIET + ["mode=real"])) == "paged"
    assert slot_allocator_kind(compose_config(QUIET + ["mode=profile"])) == "paged"
    paged = compose_config(QUIET + ["kv.slot_allocator=paged"])
    assert isinstance(build_core(paged).scheduler.kv.allocator, KVSlotAllocator)
    with pytest.raises(ValueError, match="slot_allocator"):
        slot_allocator_kind(compose_config(QUIET + ["kv.slot_allocator=bogus"]))
