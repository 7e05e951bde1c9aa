"""experiments.fidelity_runs over a layout of several GPUs (`--base tp=2`: its ranks spawned once, on CPU with gloo
here, the leader serving every workload with a fresh scheduler) writes what experiments.fidelity_table scores, and
the table prices the real plans as that layout: its re-pricing equals the predictions the run recorded with the
same cost model."""
from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("torch")

from experiments.fidelity_runs import run_real, run_sims  # noqa: E402
from experiments.fidelity_table import build  # noqa: E402
from experiments.tp_launch_report import join, summary  # noqa: E402

BASE = ["model=tiny_mla_moe", "hardware=cpu", "real.device=cpu", "real.dtype=float32", "real.as_fast_as_possible=true",
        "kv.capacity_tokens=3000", "costmodel=roofline", "workload.num_groups=2", "workload.prompts_per_group=3",
        "workload.system_prompt_len=40", "workload.question_len=12", "workload.output_len=10"]


def test_a_tp2_layout_is_run_and_scored_as_that_layout(tmp_path):
    base = BASE + ["tp=2"]
    run_real(tmp_path / "real", ["shared_prefix_lpm", "shared_prefix_fcfs"], base)
    for name in ("shared_prefix_lpm", "shared_prefix_fcfs"):      # the second on the same ranks, a fresh scheduler
        summary = json.loads((tmp_path / "real" / name / "summary.json").read_text())
        assert summary["num_finished"] == 6 and summary["leaked_kv_slots"] == 0
    run_dir = tmp_path / "real" / "shared_prefix_lpm"
    real_steps = pd.read_parquet(run_dir / "steps.parquet")
    assert pd.read_parquet(run_dir / "step_shapes.parquet")["step_id"].tolist() == real_steps["step_id"].tolist()
    launches = pd.read_parquet(run_dir / "launch_times.parquet").set_index("step_id").loc[real_steps["step_id"]]
    assert (launches["launch_start_s"] <= launches["launch_end_s"]).all() and (launches["poll_s"] >= 0).all()
    assert launches["launch_start_s"].is_monotonic_increasing      # one launch after another, on the steps' clock
    assert (launches["launch_start_s"].to_numpy() <= real_steps["end_s"].to_numpy()).all()
    run_sims(tmp_path / "sim", ["shared_prefix_lpm"], base)
    errors, steps, _ = build(tmp_path / "real", tmp_path / "sim", ["shared_prefix_lpm"], base)
    assert len(errors) == 3 and len(steps) == len(real_steps)
    assert steps["roofline_s"].tolist() == pytest.approx(real_steps["predicted_s"].tolist(), rel=1e-12)
    # each step also placed behind its real predecessor (its launch times recorded): as the driver times steps
    assert errors["in_context_step_error_median"].notna().all() and (steps["roofline_in_context_s"] > 0).all()
    one_gpu = build(tmp_path / "real", tmp_path / "sim", ["shared_prefix_lpm"], BASE)[1]   # priced as tp=1
    assert one_gpu["roofline_s"].tolist() != pytest.approx(real_steps["predicted_s"].tolist(), rel=1e-6)


def test_launch_parts_are_timed_on_the_leader_when_asked(tmp_path, monkeypatch):
    """TWINSERVE_LAUNCH_PARTS=1: each launch's parts sit beside its launch time, the hand-off to the peer among
    them, and together they fit inside the launch."""
    monkeypatch.setenv("TWINSERVE_LAUNCH_PARTS", "1")
    run_real(tmp_path / "real", ["shared_prefix_lpm"], BASE + ["tp=2"])
    launches = pd.read_parquet(tmp_path / "real" / "shared_prefix_lpm" / "launch_times.parquet")
    launch_ms = 1e3 * (launches["launch_end_s"] - launches["launch_start_s"])
    assert (launches["send_ms"] > 0).all() and (launches["prepare_ms"] > 0).all()
    assert (launches["send_ms"] + launches["prepare_ms"] + launches["to_device_ms"] <= launch_ms + 1e-6).all()
    assert (launches["recv_ms"] == 0).all()        # the leader never waits in recv
    # the follower timed every step it ran on the leader's clock: none began before the leader began launching it
    follower = pd.read_parquet(tmp_path / "real" / "follower_steps_rank1.parquet")
    served = follower.iloc[len(follower) - len(launches):]     # the warm-up's steps come first
    starts = launches["clock_origin_s"] + launches["launch_start_s"]
    assert len(follower) >= len(launches) and (served["run_ms"] > 0).all() and (served["recv_ms"] >= 0).all()
    assert (served["run_start_perf_s"].to_numpy() >= starts.to_numpy()).all()
    assert served["new_tokens"].sum() > 0
    # the report joins them step by step
    rows = join(tmp_path / "real")
    assert rows["step_id"].tolist() == launches["step_id"].tolist() and (rows["follower_lag_ms"] >= 0).all()
    assert rows["follower_run_ms"].tolist() == pytest.approx(served["run_ms"].tolist())
    assert set(summary(rows).index.get_level_values("kind")) == {"decode", "extend"}
