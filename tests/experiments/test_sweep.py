"""The sweep loader: one row per run with the overridden keys and the summary metrics; the Hydra
callback writes sweep.parquet / sweep.csv at the multirun root."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.sweep import (METRIC_COLUMNS, SWEEP_CSV, SWEEP_PARQUET, format_sweep, load_sweep,
                               parse_overrides, varying_keys)
from experiments.sweep_callback import SweepTableCallback


def fake_run(run_dir: Path, overrides: list[str], ttft_p50_s: float, finished: int = 10) -> None:
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), run_dir / ".hydra" / "overrides.yaml")
    summary = {"mode": "sim", "num_requests": 10, "num_finished": finished, "num_aborted": 10 - finished,
               "duration_s": 2.0, "wall_time_s": 0.1, "cache_hit_rate": 0.5, "num_steps": 7,
               "num_retractions": 0, "kv_capacity_tokens": 1000,
               "throughput": {"requests_per_s": 5.0, "input_tokens_per_s": 50.0, "output_tokens_per_s": 20.0},
               "ttft_s": {"mean": ttft_p50_s, "p50": ttft_p50_s, "p90": ttft_p50_s, "p99": 2 * ttft_p50_s},
               "itl_s": {"mean": None, "p50": None, "p90": None, "p99": None},
               "tpot_s": {"mean": 0.01, "p50": 0.01, "p90": 0.01, "p99": 0.02},
               "e2e_s": {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}}
    (run_dir / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep_dir(tmp_path):
    for job, (policy, capacity, ttft) in enumerate([("fcfs", "1000", 0.5), ("lpm", "1000", 0.2),
                                                    ("fcfs", "null", 0.4), ("lpm", "null", 0.1)]):
        fake_run(tmp_path / str(job), ["+experiment=policy_study", f"policy={policy}",
                                       f"kv.capacity_tokens={capacity}"], ttft)
    (tmp_path / "multirun.yaml").write_text("{}\n")
    return tmp_path


def test_one_row_per_run_with_overrides_and_metrics(sweep_dir):
    table = load_sweep(sweep_dir)
    assert list(table["run"]) == ["0", "1", "2", "3"]
    assert list(table.columns[:4]) == ["run", "experiment", "policy", "kv.capacity_tokens"]
    assert set(METRIC_COLUMNS) <= set(table.columns)
    assert list(table["policy"]) == ["fcfs", "lpm", "fcfs", "lpm"]
    assert table["kv.capacity_tokens"].tolist()[:2] == [1000, 1000] and table["kv.capacity_tokens"].isna()[2:].all()
    assert table["ttft_p50_s"].tolist() == [0.5, 0.2, 0.4, 0.1]
    assert table["ttft_p99_s"].tolist() == [1.0, 0.4, 0.8, 0.2]
    assert table["output_tokens_per_s"].eq(20.0).all() and table["itl_p50_s"].isna().all()
    assert varying_keys(table) == ["policy", "kv.capacity_tokens"]


def test_job_order_is_numeric(tmp_path):
    for job in (10, 2, 1):
        fake_run(tmp_path / str(job), [f"seed={job}"], 0.1)
    assert load_sweep(tmp_path)["seed"].tolist() == [1, 2, 10]


def test_an_empty_directory_gives_an_empty_table(tmp_path):
    table = load_sweep(tmp_path)
    assert len(table) == 0 and "ttft_p50_s" in table.columns


def test_override_parsing():
    assert parse_overrides(["+experiment=a", "++seed=1", "~cache", "workload.path=/x=y"]) == \
        {"experiment": "a", "seed": "1", "workload.path": "/x=y"}


def test_callback_writes_and_prints_the_table(sweep_dir, capsys):
    callback = SweepTableCallback()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)
    parquet, csv = pd.read_parquet(sweep_dir / SWEEP_PARQUET), pd.read_csv(sweep_dir / SWEEP_CSV)
    assert len(parquet) == len(csv) == 4
    out = capsys.readouterr().out
    assert "sweep of 4 runs" in out and format_sweep(parquet).splitlines()[0] in out
    assert "ttft_p50_ms" in out and "experiment" not in out.splitlines()[1]   # constant keys are not shown
