"""experiments.decode_price_bias: decode steps measured at a known multiple of the profile's own price come back
at the inverse of that multiple, per batch bucket; other step kinds are left out."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate

from experiments.compose import compose_config
from experiments.decode_price_bias import price_over_measured
from runtime.core.layout import ParallelLayout
from sim.costmodel.base import StepShape
from sim.costmodel.profiled import ProfiledCostModel
from sim.costmodel.roofline import RooflineCostModel

PROFILE = Path("sim/profiles/h200/deepseek_v2_lite")


def test_steps_at_a_known_multiple_of_the_price(tmp_path: Path) -> None:
    cfg = compose_config(["mode=sim", "model=deepseek_v2_lite", "hardware=h200"])
    model, hardware = instantiate(cfg.model), instantiate(cfg.hardware)
    cm = ProfiledCostModel(model, hardware, ParallelLayout(), fallback=RooflineCostModel,
                           profile=str(PROFILE))
    rows, start = [], 0.0
    for batch, context, slower in [(1, 900, 1.25), (1, 1500, 1.25), (6, 6 * 700, 0.8), (40, 40 * 2000, 1.0)]:
        took = slower * cm.device_time_s(StepShape(num_decode_reqs=batch, decode_context_tokens=context))
        rows.append({"mode": "decode", "batch_size": batch, "decode_context_tokens": context,
                     "start_s": start, "end_s": start + took})
        start += took
    rows.append({"mode": "extend", "batch_size": 1, "decode_context_tokens": 0, "start_s": start, "end_s": start + 9.0})
    pd.DataFrame(rows).to_parquet(tmp_path / "steps.parquet")
    table = price_over_measured(model, hardware, PROFILE, tmp_path)
    assert list(table.index) == ["1-1", "4-7", "32-63"]
    assert list(table["steps"]) == [2, 1, 1]
    assert table["price_over_measured"].tolist() == pytest.approx([0.8, 1.25, 1.0])
