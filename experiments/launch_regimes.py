"""Where a real run's extend steps spend their time against their launch: per token bucket and kind of step ahead,
the median step duration (device interval), head start (the step ahead's end minus this launch's start), launch
duration (host), time inside the launch's polls, and end minus launch return (> 0: device-bound past the launch;
~0: the launch set the end). Reads fidelity runs that carry launch_times.parquet (experiments/fidelity_runs.py).
Launch times are first put on the device clock of the step records (clock_offset_s). Torch-free.

  python -m experiments.launch_regimes experiments/results/h200x2/launch_times/tp2 [--csv OUT.csv]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from experiments.launch_timer import LAUNCH_TIMES_FILE

TOKEN_BUCKETS = [0, 600, 2048, 4096, 1_000_000_000]


def clock_offset_s(steps: pd.DataFrame) -> float:
    """How late the launch times of a run lie against its step records (>= 0): a step's start event is recorded
    on the device once its launch has begun, so no start precedes its launch's begin, and the largest
    launch_start_s - start_s (a step launched on an idle device) is the offset, up to the event's latency.
    Files written before experiments/launch_timer.py took its origin after the runner's clock_origin carry the
    time that call took (1.55-1.84 ms in the tp=2 runs of experiments/results/h200x2/launch_times, 0.54-0.64
    ms at tp=1); with a host waiting on step n-1 before launching step n+1, the earliest such launch after that
    end bounds it from above (1.69-2.09 ms there)."""
    return max(float((steps["launch_start_s"] - steps["start_s"]).max()), 0.0)


def aligned_launches(run_dir: Path) -> pd.DataFrame:
    """The run's steps (sorted by step_id) with their launch times, shifted onto the step records' clock."""
    steps = pd.read_parquet(run_dir / "steps.parquet").sort_values("step_id")
    steps = steps.merge(pd.read_parquet(run_dir / LAUNCH_TIMES_FILE), on="step_id")
    offset = clock_offset_s(steps)
    steps["launch_start_s"] -= offset
    steps["launch_end_s"] -= offset
    steps.attrs["clock_offset_s"] = offset
    return steps


def launch_regimes(run_dir: Path) -> pd.DataFrame:
    """One row per (token bucket, mode of the step ahead) of the run's prefill-only extend steps (the offset its
    launch times were shifted by in attrs["clock_offset_s"])."""
    steps = aligned_launches(run_dir)
    steps["ahead"] = steps["mode"].shift(1)
    steps["duration_s"] = steps["end_s"] - steps["start_s"]
    steps["head_start_s"] = steps["end_s"].shift(1) - steps["launch_start_s"]
    steps["launch_s"] = steps["launch_end_s"] - steps["launch_start_s"]
    steps["end_after_launch_s"] = steps["end_s"] - steps["launch_end_s"]
    extends = steps[(steps["mode"] == "extend") & (steps["num_decode_requests"] == 0)].copy()
    extends["tokens"] = pd.cut(extends["num_prefill_tokens"], TOKEN_BUCKETS)
    groups = extends.groupby(["tokens", "ahead"], observed=True)
    columns = ["duration_s", "head_start_s", "launch_s", "poll_s", "end_after_launch_s"]
    table = groups[columns].median().assign(steps=groups.size()).reset_index()
    table.attrs["clock_offset_s"] = steps.attrs["clock_offset_s"]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="a folder of fidelity runs (one sub-folder per workload)")
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    frames = []
    for run_dir in sorted(p for p in args.runs.iterdir() if (p / LAUNCH_TIMES_FILE).exists()):
        table = launch_regimes(run_dir)
        offset = table.attrs["clock_offset_s"]
        table = table.assign(workload=run_dir.name)
        frames.append(table)
        print(f"{run_dir.name} (launch times {offset * 1e3:.2f} ms earlier onto the step records' clock)")
        print(table.drop(columns="workload").round(4).to_string(index=False))
    if args.csv is not None and frames:
        pd.concat(frames, ignore_index=True).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
