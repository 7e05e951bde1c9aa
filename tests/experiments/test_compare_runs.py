"""experiments/compare_runs.py: a run compared with itself has zero error everywhere and full plan
agreement; two runs that differ in timing show it in the errors."""
from __future__ import annotations

import math

from experiments.compare_runs import compare, error_table
from experiments.compose import compose_config
from sim.app import run_sim

SMALL = ["mode=sim", "progress=false", "print_summary=false", "workload.num_groups=2", "workload.prompts_per_group=4",
         "workload.output_len=16"]


def test_a_run_compared_with_itself_has_zero_error(tmp_path):
    run_sim(compose_config(SMALL + ["costmodel=roofline"]), out_dir=tmp_path / "a")
    result = compare(tmp_path / "a", tmp_path / "a")
    numbers = {k: v for k, v in result.items() if isinstance(v, float)}
    assert numbers and all(v == 0.0 for k, v in numbers.items() if k != "plan_agreement"), numbers
    assert result["plan_agreement"] == 1.0 and result["requests_joined"] == 8


def test_different_cost_models_show_up_as_errors(tmp_path):
    run_sim(compose_config(SMALL + ["costmodel=roofline"]), out_dir=tmp_path / "roofline")
    run_sim(compose_config(SMALL + ["costmodel=profiled"]), out_dir=tmp_path / "profiled")
    table = error_table({"small": (tmp_path / "roofline", tmp_path / "profiled")})
    row = table.iloc[0]
    assert row["run"] == "small" and row["step_error_median"] > 0 and not math.isnan(row["ttft_mean"])
    assert abs(row["tpot_mean"]) > 0 and 0 < row["plan_agreement"] <= 1
