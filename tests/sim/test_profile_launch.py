"""sim.costmodel.profile_launch: a profile's launch times by regime (decode; extends in piecewise graphs up
to the limit, eager beyond), and the profiled model's launch_time_s reading them."""
from __future__ import annotations

import pandas as pd
import pytest

from sim.costmodel.profile_launch import LaunchTable

ROWS = pd.DataFrame({
    "kind": ["decode", "decode", "prefill", "prefill", "prefill", "prefill", "prefill"],
    "num_reqs": [1, 64, 1, 1, 8, 1, 8],
    "new_tokens": [1, 64, 128, 1024, 1024, 8192, 8192],
    "launch_s": [0.001, 0.002, 0.006, 0.007, 0.009, 0.030, 0.040],
})


def test_extend_launches_follow_their_regime_and_decode_the_batch():
    table = LaunchTable(ROWS, piecewise_max_tokens=2048)
    assert table.launch_s(0, 0, 1) == pytest.approx(0.001)
    assert table.launch_s(0, 0, 64) == pytest.approx(0.002)
    assert table.launch_s(0, 0, 0) == 0.0
    assert table.launch_s(1, 128, 0) == pytest.approx(0.006)
    assert table.launch_s(2, 1024, 0) == pytest.approx(0.008)            # the mean over request counts
    assert table.launch_s(1, 2048, 0) < 0.02 < table.launch_s(1, 2049, 0)   # piecewise, then eager
    assert table.launch_s(1, 4096, 0) == pytest.approx(0.035)          # one eager point: flat below it
    assert table.launch_s(1, 1000, 24) == table.launch_s(1, 1024, 0)   # a mixed step's decodes: one token each


def test_without_piecewise_graphs_every_extend_is_eager_and_a_missing_regime_borrows_the_other():
    eager = LaunchTable(ROWS, piecewise_max_tokens=0)
    assert eager.launch_s(1, 128, 0) == pytest.approx(0.006)           # every extend row is in the eager curve
    only_small = LaunchTable(ROWS[ROWS["new_tokens"] <= 1024], piecewise_max_tokens=2048)
    assert only_small.launch_s(1, 8192, 0) == pytest.approx(only_small.piecewise(8192))


def test_the_profiled_model_reads_launches_from_the_host_table():
    from experiments.compose import compose_config
    from runtime.build import build_core
    from sim.costmodel.base import StepShape
    from sim.predictor import build_cost_model

    cfg = compose_config(["mode=sim", "model=deepseek_v2_lite", "hardware=h200", "costmodel=profiled"])
    model = build_cost_model(cfg, build_core(cfg))
    host = pd.read_csv(model.directory / "host.csv")
    row = host[(host["kind"] == "prefill") & (host["num_reqs"] == 1) & (host["new_tokens"] == 128)].iloc[0]
    assert model.launch_time_s(StepShape((128,), (0,))) == pytest.approx(row["launch_s"])
    decode = host[(host["kind"] == "decode") & (host["num_reqs"] == 64)].iloc[0]
    assert model.launch_time_s(StepShape(num_decode_reqs=64, decode_context_tokens=64 * 1024)) == pytest.approx(
        decode["launch_s"])
