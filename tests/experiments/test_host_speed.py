"""experiments/host_speed.py: each launch's host time over the profiled model's launch price, and the slow spells."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from experiments.compose import compose_config
from experiments.host_speed import SLOW_RATIO, launch_ratios, run_row, slow_spells
from experiments.launch_timer import LAUNCH_TIMES_FILE
from runtime.build import build_core
from sim.costmodel.base import StepShape
from sim.predictor import build_cost_model
from sim.step_shapes import shape_row, shapes_frame, write_step_shapes


def _run(tmp_path, factors: list[float], starts: list[float]):
    """Extend steps of 512 new tokens whose launches took `factors` times the profile's price."""
    shape = StepShape((512,), (0,), 0, 0)
    cfg = compose_config(["mode=sim", "costmodel=profiled"])
    price = build_cost_model(cfg, build_core(cfg)).launch_time_s(shape)
    n = len(factors)
    pd.DataFrame({"step_id": range(n), "start_s": starts, "end_s": [s + 0.02 for s in starts],
                  "num_prefill_tokens": [512] * n, "num_decode_requests": [0] * n}).to_parquet(
                      tmp_path / "steps.parquet")
    write_step_shapes(tmp_path, shapes_frame([shape_row(i, shape) for i in range(n)]))
    pd.DataFrame({"step_id": range(n), "launch_start_s": starts,
                  "launch_end_s": [s + f * price + 0.001 for s, f in zip(starts, factors)],
                  "poll_s": [0.001] * n}).to_parquet(tmp_path / LAUNCH_TIMES_FILE)
    (tmp_path / "summary.json").write_text(json.dumps({"overrides": []}))
    return tmp_path


def test_a_launchs_ratio_is_its_host_time_without_polls_over_the_profiles_price(tmp_path):
    frame = launch_ratios(_run(tmp_path, [1.0, 2.0], [0.0, 0.5]))
    assert frame["ratio"].tolist() == pytest.approx([1.0, 2.0])
    assert set(frame["kind"]) == {"extend"}


def test_slow_launches_close_together_make_one_spell(tmp_path):
    run = _run(tmp_path, [1.0, 1.8, 1.9, 1.0, 1.7], [0.0, 1.0, 1.5, 2.0, 4.0])
    frame = launch_ratios(run)
    spells = slow_spells(frame)
    assert spells == [(1.0, 1.5), (4.0, 4.0)]
    row = run_row(run, frame)
    assert row["slow_extend_share"] == pytest.approx(3 / 5) and row["slow_spells"] == 2
    assert row["longest_spell_s"] == pytest.approx(0.5) and SLOW_RATIO < 1.7
