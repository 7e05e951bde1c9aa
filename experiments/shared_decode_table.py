"""Decode over shared prefixes, predicted against served: for each model and shared-prefix workload of
experiments/fidelity_runs.py run for real (experiments/gpu_jobs/shared_decode.sh, records under
experiments/results/h200/shared_decode/<model>/<workload>/), `mode=sim` of the same workload with
costmodel=profiled, and the profiled price of every real decode step against its measured time.
Writes errors.csv beside the records. Torch-free.

  python -m experiments.shared_decode_table [--root experiments/results/h200/shared_decode]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.compose import compose_config
from experiments.fidelity_runs import ALL_WORKLOADS, QUIET
from runtime.build import build_core
from sim.predictor import build_cost_model
from sim.step_shapes import read_shapes

ROOT = Path("experiments/results/h200/shared_decode")


def rel(sim: float, real: float) -> float:
    return round(sim / real - 1.0, 4)


def row(model: str, workload: str, run_dir: Path, scratch: Path) -> dict:
    from sim.app import run_sim

    overrides = ["mode=sim", f"model={model}", "hardware=h200", "costmodel=profiled"] + ALL_WORKLOADS[workload]
    cfg = compose_config(overrides + QUIET)
    sim = run_sim(cfg, out_dir=scratch / model / workload)
    real = json.loads((run_dir / "summary.json").read_text())
    cost = build_cost_model(cfg, build_core(cfg))
    shapes = read_shapes(run_dir)
    steps = pd.read_parquet(run_dir / "steps.parquet")
    measured = (steps["end_s"] - steps["start_s"]).to_numpy()
    decode = np.array([s.is_decode_only for s in shapes])
    priced = np.array([cost.step_time_s(s) - cost.host_time_s(s) for s in shapes])
    shared = np.array([s.decode_shared_tokens / s.decode_context_tokens if s.num_decode_reqs else 0.0 for s in shapes])
    return {"model": model, "workload": workload, "shared_read_fraction": round(cost.shared_read_fraction, 4),
            "decode_shared_share_median": round(float(np.median(shared[decode])), 3),
            "throughput": rel(sim["throughput"]["requests_per_s"], real["throughput"]["requests_per_s"]),
            "ttft_p50": rel(sim["ttft_s"]["p50"], real["ttft_s"]["p50"]),
            "ttft_p99": rel(sim["ttft_s"]["p99"], real["ttft_s"]["p99"]),
            "tpot_mean": rel(sim["tpot_s"]["mean"], real["tpot_s"]["mean"]),
            "decode_step_ratio_median": round(float(np.median(priced[decode] / measured[decode])), 4),
            "step_error_median": round(float(np.median(np.abs(priced / measured - 1.0))), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for run_dir in sorted(p.parent for p in args.root.glob("*/*/summary.json")):
            rows.append(row(run_dir.parent.name, run_dir.name, run_dir, Path(scratch)))
    table = pd.DataFrame(rows)
    table.to_csv(args.root / "errors.csv", index=False)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
