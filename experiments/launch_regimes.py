"""Where a real run's extend steps spend their time against their launch: per token bucket and kind of step ahead,
the median step duration (device interval), head start (the step ahead's end minus this launch's start), launch
duration (host), time inside the launch's polls, and end minus launch return (> 0: device-bound past the launch;
~0: the launch set the end). Reads fidelity runs that carry launch_times.parquet (experiments/fidelity_runs.py).
Torch-free.

  python -m experiments.launch_regimes experiments/results/h200x2/launch_times/tp2 [--csv OUT.csv]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from experiments.launch_timer import LAUNCH_TIMES_FILE

TOKEN_BUCKETS = [0, 600, 2048, 4096, 1_000_000_000]


def launch_regimes(run_dir: Path) -> pd.DataFrame:
    """One row per (token bucket, mode of the step ahead) of the run's prefill-only extend steps."""
    steps = pd.read_parquet(run_dir / "steps.parquet").sort_values("step_id")
    steps = steps.merge(pd.read_parquet(run_dir / LAUNCH_TIMES_FILE), on="step_id")
    steps["ahead"] = steps["mode"].shift(1)
    steps["duration_s"] = steps["end_s"] - steps["start_s"]
    steps["head_start_s"] = steps["end_s"].shift(1) - steps["launch_start_s"]
    steps["launch_s"] = steps["launch_end_s"] - steps["launch_start_s"]
    steps["end_after_launch_s"] = steps["end_s"] - steps["launch_end_s"]
    extends = steps[(steps["mode"] == "extend") & (steps["num_decode_requests"] == 0)].copy()
    extends["tokens"] = pd.cut(extends["num_prefill_tokens"], TOKEN_BUCKETS)
    groups = extends.groupby(["tokens", "ahead"], observed=True)
    columns = ["duration_s", "head_start_s", "launch_s", "poll_s", "end_after_launch_s"]
    return groups[columns].median().assign(steps=groups.size()).reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="a folder of fidelity runs (one sub-folder per workload)")
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    frames = []
    for run_dir in sorted(p for p in args.runs.iterdir() if (p / LAUNCH_TIMES_FILE).exists()):
        table = launch_regimes(run_dir).assign(workload=run_dir.name)
        frames.append(table)
        print(run_dir.name)
        print(table.drop(columns="workload").round(4).to_string(index=False))
    if args.csv is not None and frames:
        pd.concat(frames, ignore_index=True).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
