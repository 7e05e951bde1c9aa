"""mode=sim with dp > 1 (and DP attention): every request finishes once on one replica, each
replica runs one step at a time, routers behave as routed, fast-forward stays exact, dp=1 is
untouched, and layouts up to 64 GPUs simulate."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.compose import compose_config
from sim.app import run_sim

QUIET = ["progress=false", "print_summary=false"]
GROUPS = ["workload.num_groups=4", "workload.prompts_per_group=6", "workload.system_prompt_len=512",
          "workload.output_len=32", "workload.request_rate=20"]
POISSON = ["workload=random", "workload.num_requests=40", "workload.request_rate=40",
           "workload.input_len=256", "workload.output_len=48"]


def simulate(tmp_path: Path, name: str, overrides: list[str]) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    out = tmp_path / name
    summary = run_sim(compose_config(QUIET + overrides), out_dir=out)
    return summary, pd.read_parquet(out / "requests.parquet"), pd.read_parquet(out / "steps.parquet")


def check_no_request_lost(summary: dict, requests: pd.DataFrame, steps: pd.DataFrame, num: int, dp: int) -> None:
    assert summary["num_requests"] == summary["num_finished"] == num and summary["num_aborted"] == 0
    assert requests["rid"].is_unique and len(requests) == num
    assert (requests["finish_reason"] == "length").all()
    assert set(requests["replica"]) <= set(range(dp)) and set(steps["replica"]) <= set(range(dp))
    assert sum(summary["dp"]["requests_per_replica"]) == num
    for replica, own in steps.groupby("replica"):
        own = own.sort_values("start_s")
        assert (own["start_s"].to_numpy()[1:] >= own["end_s"].to_numpy()[:-1] - 1e-12).all(), replica
        assert own["step_id"].is_unique


@pytest.mark.parametrize("router", ["round_robin", "shortest_queue", "cache_aware"])
@pytest.mark.parametrize("workload", ["groups", "poisson"])
def test_dp2_finishes_every_request_once(tmp_path, router, workload) -> None:
    overrides = (GROUPS if workload == "groups" else POISSON) + ["dp=2", f"router={router}"]
    summary, requests, steps = simulate(tmp_path, router, overrides)
    check_no_request_lost(summary, requests, steps, 24 if workload == "groups" else 40, dp=2)
    assert summary["dp"]["router"].lower().startswith(router.split("_")[0])


def test_round_robin_alternates_in_arrival_order(tmp_path) -> None:
    _, requests, _ = simulate(tmp_path, "rr", POISSON + ["dp=3", "router=round_robin"])
    assert requests["replica"].tolist() == [i % 3 for i in range(40)]


def test_cache_aware_keeps_groups_together_and_hits_more(tmp_path) -> None:
    rr, rr_req, _ = simulate(tmp_path, "rr", GROUPS + ["dp=2", "router=round_robin"])
    ca, ca_req, _ = simulate(tmp_path, "ca", GROUPS + ["dp=2", "router=cache_aware"])
    group = ca_req["rid"].str.extract(r"-g(\d+)-")[0]
    assert (ca_req.groupby(group)["replica"].nunique() == 1).all()      # one replica per system prompt
    assert (rr_req.groupby(group)["replica"].nunique() == 2).any()
    assert ca["cache_hit_rate"] > rr["cache_hit_rate"] + 0.05


def test_shortest_queue_fills_the_replica_that_drained(tmp_path) -> None:
    """Output lengths vary 20-fold: round robin leaves one replica with far more output tokens whenever
    the long requests happen to alternate onto it, shortest queue follows the finishes. One arrival
    sequence can go either way (step timings decide which replica drains first), so the claim is over
    four seeds: shortest queue's imbalance, summed, is below round robin's."""
    overrides = ["workload=random", "workload.num_requests=60", "workload.request_rate=30",
                 "workload.input_len=128", "workload.output_len=256", "workload.range_ratio=0.05", "dp=2"]
    spread = lambda req: abs(req.groupby("replica")["output_tokens"].sum().diff().iloc[-1])   # noqa: E731
    rr_total = sq_total = 0.0
    for seed in range(4):
        _, rr_req, _ = simulate(tmp_path, f"rr{seed}", overrides + ["router=round_robin", f"seed={seed}"])
        _, sq_req, _ = simulate(tmp_path, f"sq{seed}", overrides + ["router=shortest_queue", f"seed={seed}"])
        rr_total += spread(rr_req)
        sq_total += spread(sq_req)
        assert sq_req["replica"].tolist() != [i % 2 for i in range(60)]
    assert sq_total < rr_total


@pytest.mark.parametrize("overlap", [False, True])
def test_fast_forward_is_exact_with_replicas(tmp_path, overlap) -> None:
    overrides = POISSON + ["dp=2", "router=shortest_queue", f"overlap={overlap}"]
    _, req_on, steps_on = simulate(tmp_path, "on", overrides + ["sim.fast_forward=true"])
    _, req_off, steps_off = simulate(tmp_path, "off", overrides + ["sim.fast_forward=false"])
    pd.testing.assert_frame_equal(steps_on.drop(columns=["start_s", "end_s"]), steps_off.drop(columns=["start_s", "end_s"]))
    pd.testing.assert_series_equal(steps_on["end_s"], steps_off["end_s"], rtol=1e-9)
    pd.testing.assert_frame_equal(req_on.drop(columns=["token_times_s"]), req_off.drop(columns=["token_times_s"]), rtol=1e-9)


def test_dp1_records_have_no_replica_column(tmp_path) -> None:
    summary, requests, steps = simulate(tmp_path, "one", GROUPS)
    assert "replica" not in requests.columns and "replica" not in steps.columns and "dp" not in summary


def test_dp_attention_ranks_step_in_lockstep(tmp_path) -> None:
    overrides = POISSON + ["model=deepseek_v3", "tp=8", "dp=8", "ep=8", "dp_attention=true", "router=round_robin"]
    summary, requests, steps = simulate(tmp_path, "dpa", overrides)
    check_no_request_lost(summary, requests, steps, 40, dp=8)
    assert summary["dp"]["num_gpus"] == 8 and summary["dp"]["dp_attention"]
    ends_by_start = steps.groupby("start_s")["end_s"].nunique()
    assert (ends_by_start == 1).all()                 # ranks that step together end together
    assert steps.groupby("start_s")["replica"].nunique().max() > 1


def test_dp_attention_of_a_profiled_model_prices_its_parts_with_the_roofline(tmp_path) -> None:
    """DeepSeek-V2-Lite has an H200 profile of whole one-GPU steps; DP attention prices attention and
    MLP apart, so `costmodel=auto` takes its roofline there and `costmodel=profiled` is refused."""
    layout = ["model=deepseek_v2_lite", "hardware=h200", "tp=2", "dp=2", "dp_attention=true"]
    summary, requests, steps = simulate(tmp_path, "dpa_v2", POISSON + layout)
    check_no_request_lost(summary, requests, steps, 40, dp=2)
    with pytest.raises(ValueError, match="costmodel=profiled prices whole one-GPU steps"):
        simulate(tmp_path, "dpa_profiled", POISSON + layout + ["costmodel=profiled"])


@pytest.mark.parametrize("layout", [
    ["model=deepseek_v3", "tp=8", "dp=8"],                          # 64 GPUs, 8 replicas
    ["model=deepseek_v3", "tp=16", "ep=16", "dp=4"],                # 64 GPUs, TP/EP across 2 nodes
    ["model=deepseek_v3", "tp=64", "ep=64"],                        # 64 GPUs, one replica
    ["model=deepseek_v3", "tp=32", "pp=2", "dp_attention=true", "dp=32"],   # 64 GPUs, DP attention
    ["model=llama3_8b", "dp=64", "router=cache_aware"],             # 64 one-GPU replicas
])
def test_layouts_up_to_64_gpus_simulate(tmp_path, layout) -> None:
    summary, requests, _ = simulate(tmp_path, "big", POISSON + layout)
    assert summary["num_finished"] == 40


def test_replica_cores_are_independent_and_dp_attention_adjusts_their_config() -> None:
    from runtime.build import build_replica_cores
    cores = build_replica_cores(compose_config(["dp=3"]))
    assert len({id(c.scheduler) for c in cores}) == 3 and len({id(c.scheduler.kv) for c in cores}) == 3
    assert cores[0].scheduler.config.chunked_prefill_size == 8192
    ranks = build_replica_cores(compose_config(["model=deepseek_v3", "tp=8", "dp=4", "dp_attention=true"]))
    config = ranks[0].scheduler.config       # SGLang: chunked_prefill_size // dp, conservativeness x 0.3
    assert config.chunked_prefill_size == 2048 and config.init_new_token_ratio == pytest.approx(0.21)
