"""experiments/real_spread.py: a set of runs against itself has no spread; a set whose runs differ shows it, row per
workload the two sets share."""
from __future__ import annotations

import pytest

from experiments.compose import compose_config
from experiments.real_spread import spread_table
from sim.app import run_sim

SMALL = ["mode=sim", "progress=false", "print_summary=false", "workload.num_groups=2", "workload.prompts_per_group=4",
         "workload.output_len=16"]


def test_a_set_against_itself_has_no_spread_and_another_shows_its_difference(tmp_path):
    run_sim(compose_config(SMALL + ["costmodel=roofline"]), out_dir=tmp_path / "a" / "small")
    run_sim(compose_config(SMALL + ["costmodel=profiled"]), out_dir=tmp_path / "b" / "small")
    run_sim(compose_config(SMALL + ["costmodel=profiled", "workload.output_len=8"]), out_dir=tmp_path / "b" / "only_b")
    same = spread_table(tmp_path / "a", [tmp_path / "a"])
    assert list(same["workload"]) == ["small"] and same.loc[0, "tpot_mean"] == 0.0
    assert same.loc[0, "plan_agreement"] == 1.0
    other = spread_table(tmp_path / "a", [tmp_path / "b"])
    assert list(other["workload"]) == ["small"]          # only_b is not in the reference set
    assert other.loc[0, "tpot_mean"] != 0.0 and other.loc[0, "run"] == str(tmp_path / "b")


def test_no_shared_workload_is_an_error(tmp_path):
    run_sim(compose_config(SMALL), out_dir=tmp_path / "a" / "small")
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match="no workload"):
        spread_table(tmp_path / "a", [tmp_path / "b"])
