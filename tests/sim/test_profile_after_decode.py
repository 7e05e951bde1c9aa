"""sim/costmodel/profile_after_decode.py: the share of its back-to-back excess a prefill saves right behind a decode
run, from the profile's prefill_after_decode table, and the profiled model's after_decode_saving_s that uses it."""
from __future__ import annotations

import shutil

import pandas as pd
import pytest

from experiments.compose import compose_config
from runtime.build import build_core
from sim.costmodel.base import StepShape
from sim.costmodel.profile_after_decode import AfterDecode
from sim.costmodel.profile_tables import profile_dir
from sim.costmodel.profiled import ProfiledCostModel
from sim.costmodel.roofline import RooflineCostModel


def _rows(points):
    return pd.DataFrame(points, columns=["new_tokens", "device_s", "device_alone_s", "after_decode_s"])


def test_the_share_is_the_excess_not_paid_behind_decodes_between_points_and_flat_outside():
    table = AfterDecode(_rows([(1000, 0.0200, 0.0190, 0.0191), (3000, 0.0400, 0.0380, 0.0390)]))
    assert table.saved_share(1000) == pytest.approx(0.9)
    assert table.saved_share(3000) == pytest.approx(0.5)
    assert table.saved_share(2000) == pytest.approx(0.7)          # linear in tokens
    assert table.saved_share(500) == pytest.approx(0.9) and table.saved_share(9000) == pytest.approx(0.5)


def test_noise_points_are_left_out_and_shares_stay_within_0_and_1():
    table = AfterDecode(_rows([(256, 0.0100, 0.00999, 0.0090),       # excess 0.1% of the step: noise, left out
                               (2048, 0.0300, 0.0280, 0.0310),       # slower behind decodes: saves nothing
                               (4096, 0.0500, 0.0470, 0.0460)]))     # faster than alone: saves all of it
    assert list(table.tokens) == [2048, 4096]
    assert table.saved_share(2048) == 0.0 and table.saved_share(4096) == 1.0
    assert AfterDecode(_rows([(256, 0.0100, 0.00999, 0.0090)])).saved_share(256) == 1.0   # nothing left: all


def _model(directory):
    core = build_core(compose_config(["mode=sim"]))
    return ProfiledCostModel(core.model, core.hardware, core.layout, fallback=RooflineCostModel,
                             profile=str(directory))


def test_the_profiled_model_saves_the_measured_share_of_a_device_bound_steps_excess(tmp_path):
    source = profile_dir("h200", "deepseek_v2_lite")
    without = tmp_path / "without"
    shutil.copytree(source, without, ignore=shutil.ignore_patterns("tp*", "prefill_after_decode.csv"))
    with_table = tmp_path / "with"
    shutil.copytree(without, with_table)
    _rows([(1024, 0.0300, 0.0280, 0.0290), (8192, 0.1000, 0.0950, 0.0975)]).to_csv(
        with_table / "prefill_after_decode.csv", index=False)
    step = StepShape(extend_new_tokens=(4096,), extend_prefix_tokens=(0,))
    full, half = _model(without).after_decode_saving_s(step), _model(with_table).after_decode_saving_s(step)
    assert full > 0 and half == pytest.approx(0.5 * full)
