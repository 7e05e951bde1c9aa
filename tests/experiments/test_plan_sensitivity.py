"""experiments.plan_sensitivity: the jitter moves only the gaps between arrivals (order and simultaneous arrivals kept),
the unjittered run is the plain simulation, and the band table says whether the real value lies within the runs."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from hydra.utils import instantiate

from experiments.compose import compose_config
from experiments.fidelity_runs import QUIET
from experiments.plan_sensitivity import METRICS, bands, jittered, simulate, workload_runs
from runtime.core.request import RequestSpec

TINY = ["model=tiny_mla_moe", "hardware=cpu", "costmodel=roofline", "workload=random", "workload.num_requests=12",
        "workload.input_len=64", "workload.output_len=6", "workload.request_rate=50"]


def specs(times: list[float]) -> list[RequestSpec]:
    return [RequestSpec(rid=f"r{i}", arrival_s=t, input_ids=(1, 2, 3), output_len=2) for i, t in enumerate(times)]


def test_jitter_keeps_the_order_and_the_requests_that_arrive_together():
    original = specs([0.0, 0.0, 0.010, 0.0105, 0.011, 0.5])
    moved = jittered(original, 0.002, seed=3)
    assert [s.rid for s in moved] == [s.rid for s in original]
    times = [s.arrival_s for s in moved]
    assert times == sorted(times) and times[0] == times[1] and min(times) >= 0.0
    assert all(abs(a.arrival_s - b.arrival_s) <= 0.002 + 1e-12 for a, b in zip(original, moved)
               if a.arrival_s > 0.02)                                         # lone arrivals move at most the jitter
    assert times != [s.arrival_s for s in original]
    assert jittered(original, 0.0, seed=3) == original
    assert jittered(original, 0.002, seed=3) == moved                         # seeded


def test_the_unjittered_run_is_the_plain_simulation(tmp_path):
    from sim.app import run_sim

    cfg = compose_config(["mode=sim", "progress=false", "print_summary=false"] + TINY)
    summary = run_sim(cfg, out_dir=tmp_path)
    rows = workload_runs("tiny", TINY, runs=2, jitter_s=0.001, seed=0)
    assert [r["run"] for r in rows] == [0, 1, 2]
    for metric in METRICS:
        plain = {"requests_per_s": summary["throughput"]["requests_per_s"], "ttft_p50_s": summary["ttft_s"]["p50"],
                 "ttft_p99_s": summary["ttft_s"]["p99"], "tpot_mean_s": summary["tpot_s"]["mean"]}[metric]
        assert rows[0][metric] == pytest.approx(plain, rel=1e-12)
    again = simulate(compose_config(["mode=sim"] + TINY + QUIET), instantiate(cfg.workload).requests())
    assert again == {m: rows[0][m] for m in METRICS}


def test_bands_say_whether_the_real_value_lies_within_the_runs(tmp_path):
    runs = pd.DataFrame([{"workload": "w", "run": i, "requests_per_s": 1.0, "ttft_p50_s": v, "ttft_p99_s": 2 * v,
                          "tpot_mean_s": 0.01} for i, v in enumerate([0.10, 0.08, 0.12])])
    real = tmp_path / "w"
    real.mkdir()
    summary = {"throughput": {"requests_per_s": 1.0}, "ttft_s": {"p50": 0.11, "p99": 0.5}, "tpot_s": {"mean": 0.01}}
    (real / "summary.json").write_text(json.dumps(summary))
    table = bands(runs, tmp_path).set_index("metric")
    assert table.loc["ttft_p50_s", "real_in_band"] and not table.loc["ttft_p99_s", "real_in_band"]
    assert table.loc["ttft_p50_s", "error"] == pytest.approx(0.10 / 0.11 - 1)
    assert table.loc["ttft_p50_s", "error_low"] == pytest.approx(0.08 / 0.11 - 1)
    assert table.loc["ttft_p99_s", "min"] == pytest.approx(0.16) and table.loc["ttft_p99_s", "unjittered"] == 0.2
