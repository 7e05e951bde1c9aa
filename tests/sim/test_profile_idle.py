"""The profile's idle_launch table as the simulator reads it: per gap the median over its steps of the launch
after that gap over the launch right after a step, 1 with no idle, linear between gaps, flat past the longest,
never below 1 nor falling with a longer gap; the profiled model uses it where the profile has it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from sim.costmodel.profile_idle import IdleLaunch

SMALL = Path(__file__).parent / "data" / "profile_small"


def table(rows: list[tuple[str, int, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["kind", "new_tokens", "gap_s", "launch_s"])


def test_the_factor_is_the_median_ratio_per_gap_interpolated_and_flat_past_the_longest():
    idle = IdleLaunch(table([
        ("prefill", 256, 0.0, 0.010), ("prefill", 256, 1.0, 0.011), ("prefill", 256, 8.0, 0.016),
        ("decode", 1, 0.0, 0.002), ("decode", 1, 1.0, 0.0021), ("decode", 1, 8.0, 0.0028),
        ("prefill", 2048, 0.0, 0.020), ("prefill", 2048, 1.0, 0.024), ("prefill", 2048, 8.0, 0.030),
    ]))
    assert idle.factor(0.0) == 1.0 and idle.factor(-1.0) == 1.0
    assert idle.factor(1.0) == pytest.approx(1.1)                # median of 1.1, 1.05, 1.2
    assert idle.factor(8.0) == pytest.approx(1.5)                # median of 1.6, 1.4, 1.5
    assert idle.factor(0.5) == pytest.approx(1.05)               # halfway from no idle to the first gap
    assert idle.factor(4.5) == pytest.approx(1.3)                # halfway between the gaps
    assert idle.factor(60.0) == pytest.approx(1.5)


def test_the_factor_never_falls_below_one_nor_with_a_longer_gap():
    idle = IdleLaunch(table([("prefill", 256, 0.0, 0.010), ("prefill", 256, 0.1, 0.009),
                             ("prefill", 256, 2.0, 0.013), ("prefill", 256, 8.0, 0.012)]))
    assert idle.factor(0.1) == 1.0
    assert idle.factor(8.0) == pytest.approx(1.3) == idle.factor(2.0)


def test_a_table_without_a_gap_zero_launch_is_refused():
    with pytest.raises(ValueError, match="gap-0"):
        IdleLaunch(table([("prefill", 256, 1.0, 0.010)]))


def test_the_profiled_model_reads_the_table_where_the_profile_has_one(tmp_path):
    from experiments.compose import compose_config
    from runtime.build import build_core
    from sim.costmodel.profiled import ProfiledCostModel
    from sim.costmodel.roofline import RooflineCostModel

    core = build_core(compose_config(["model=tiny_mla_moe", "hardware=cpu"]))
    shutil.copytree(SMALL, tmp_path / "profile")
    build = lambda: ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,  # noqa: E731
                                      profile=str(tmp_path / "profile"))
    assert build().idle_launch_factor(10.0) == 1.0
    table([("prefill", 16, 0.0, 0.01), ("prefill", 16, 4.0, 0.015)]).to_csv(tmp_path / "profile" / "idle_launch.csv",
                                                                            index=False)
    model = build()
    assert model.idle_launch_factor(4.0) == pytest.approx(1.5) and model.idle_launch_factor(2.0) == pytest.approx(1.25)
