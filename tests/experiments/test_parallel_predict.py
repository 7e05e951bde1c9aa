"""experiments/parallel_predict.py prices bench_parallel's rows with the layout's cost model: graph replays
below eager launches, the whole served step at or above its device part (pipelined served steps at it), a run's own collectives table
ahead of the hardware's (tp > 1 only), model overrides applied."""
from __future__ import annotations

import csv

import pytest

from experiments.parallel_predict import main

COLUMNS = ("model", "model_overrides", "layout", "tp", "ep", "batch", "context", "path", "ms_median")
ROWS = [("deepseek_v2_lite", "", "tp1", 1, 1, 64, 1024, "forward_graphs", 10.0),
        ("deepseek_v2_lite", "", "tp1", 1, 1, 64, 1024, "forward_eager", 25.0),
        ("deepseek_v2_lite", "", "tp4", 4, 1, 64, 1024, "forward_graphs", 8.0),
        ("deepseek_v2_lite", "", "tp4", 4, 1, 64, 1024, "forward_eager", 40.0),
        ("deepseek_v2_lite", "", "tp4ep4", 4, 4, 64, 1024, "served_step", 12.0),
        ("deepseek_v3", "model.hf_config.num_hidden_layers=5 model.weight_dtype=bfloat16", "tp4", 4, 1, 1, 1024,
         "forward_graphs", 9.0),
        ("deepseek_v3", "model.hf_config.num_hidden_layers=10 model.weight_dtype=bfloat16", "tp4", 4, 1, 1, 1024,
         "forward_graphs", 9.0),
        ("deepseek_v2_lite", "", "tp4ep4", 4, 4, 64, 1024, "served_pipelined", 9.0)]


def _predict(tmp_path, name: str, *extra: str) -> list[dict]:
    path = tmp_path / f"{name}.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(ROWS)
    assert main([str(path), "--hardware", "h200", *extra]) == 0
    with (tmp_path / f"{name}_predicted.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_rows_are_priced_by_their_layout(tmp_path) -> None:
    rows = _predict(tmp_path, "plain")
    ms = [float(r["predicted_ms"]) for r in rows]
    assert all(m > 0 for m in ms)
    assert ms[0] < ms[1] and ms[2] < ms[3]                           # graph replay < eager launches
    served = rows[4]
    assert float(served["predicted_ms"]) == float(served["pred_step_ms"]) >= float(served["pred_device_ms"])
    assert rows[2]["costmodel"] == "RooflineCostModel"
    # the ratio is of the unrounded price, predicted_ms that price to 4 decimals: equal to the last digit
    assert float(rows[5]["measured_over_predicted"]) == pytest.approx(9.0 / float(rows[5]["predicted_ms"]), abs=1e-3)
    assert float(rows[6]["predicted_ms"]) > 1.5 * float(rows[5]["predicted_ms"])   # 8 MoE layers against 2
    pipelined = rows[7]                   # served steps under overlap: their device part, as forward
    assert float(pipelined["predicted_ms"]) == float(pipelined["pred_device_ms"]) == float(served["pred_device_ms"])

    table = tmp_path / "collectives.csv"
    table.write_text("collective,num_ranks,size_bytes,graph,time_s\n"
                     "all_reduce,4,1024,0,1e-03\nall_reduce,4,1024,1,1e-03\n")   # 1 ms each: unmistakable
    slow = _predict(tmp_path, "plain", "--collectives", str(table))
    assert slow[0]["predicted_ms"] == rows[0]["predicted_ms"]                   # tp1: no collectives
    assert float(slow[2]["predicted_ms"]) > float(rows[2]["predicted_ms"]) + 27   # 2 per layer, 27 layers
